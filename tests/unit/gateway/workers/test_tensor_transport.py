"""Which tensors of a leg go through shared memory (``--multimodal-tensor-transport``).

Real segments: the writer writes to /dev/shm (or to a directory the test removes, for a
write that fails), and the tests read the segments back as a worker would.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tandem.gateway import metrics
from tandem.gateway.backends.vllm.tensor_transport import TensorTransport
from tandem.gateway.workers.worker import Worker
from tandem.wire.pixel_splice import serialize_with_pixels
from tandem.wire.pixels import PixelPayload
from tandem.wire.proto import GenerateRequest
from tandem.wire.shm import SegmentWriter, shm_namespace_id
from tandem.wire.tensors import decode_tensor, encode_into

NS = "boot-id:42"


def worker(namespace: str | None = None) -> Worker:
    labels = {"shm_namespace_id": namespace} if namespace is not None else {}
    return Worker("127.0.0.1:1", "prefill", labels, "m")


def request() -> GenerateRequest:
    """A leg with a big grid (never shm), a big model tensor and a small one."""
    req = GenerateRequest(request_id="r")
    tensors = req.mm_inputs.model_specific_tensors
    encode_into(tensors["image_grid_thw"], np.ones((20000, 3), dtype=np.int64))
    encode_into(tensors["image_embeds_hint"], np.arange(50000, dtype=np.float32))
    encode_into(tensors["patches_per_image"], np.array([16], dtype=np.int64))
    return req


def pixels(n: int = 40000) -> PixelPayload:
    return PixelPayload.from_array(np.linspace(0, 1, n, dtype=np.float32).reshape(-1, 8))


def sample(name: str, labels: dict[str, str] | None = None) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels or {}) or 0.0


@pytest.fixture
def transports():
    made: list[TensorTransport] = []

    def make(mode, min_bytes=65536, **kw) -> TensorTransport:
        made.append(TensorTransport(mode, min_bytes, namespace_id=kw.pop("ns", NS), **kw))
        return made[-1]

    yield make
    for t in made:
        t.close()


def test_inline_leaves_the_leg_alone(transports) -> None:
    req, px = request(), pixels()
    leg = transports("inline").prepare(worker(NS), req, px)
    assert leg.request is req and leg.pixels is px and leg.segments == []


def test_shm_moves_big_tensors_but_never_grids_and_leaves_the_request_alone(transports) -> None:
    req, px = request(), pixels()
    before = sample("tandem_mm_tensors_total", {"path": "shm"})
    leg = transports("shm").prepare(worker(), req, px)  # shm: no label needed
    assert len(leg.segments) == 2
    assert leg.pixels is not None and leg.pixels.shm is not None
    tensors = leg.request.mm_inputs.model_specific_tensors
    assert tensors["image_grid_thw"].WhichOneof("payload") == "inline"  # M-RoPE grid
    assert tensors["patches_per_image"].WhichOneof("payload") == "inline"  # small
    assert tensors["image_embeds_hint"].WhichOneof("payload") == "shm"
    # The caller's request (and so the decode leg built from it) keeps every tensor inline.
    assert req.mm_inputs.model_specific_tensors["image_embeds_hint"].WhichOneof("payload") == (
        "inline"
    )
    assert sample("tandem_mm_tensors_total", {"path": "shm"}) == before + 2
    # What the worker gets decodes to the same values.
    sent = GenerateRequest.FromString(serialize_with_pixels(leg.request, leg.pixels))
    np.testing.assert_array_equal(
        decode_tensor(sent.mm_inputs.pixel_values), px.array.reshape(px.shape)
    )
    np.testing.assert_array_equal(
        decode_tensor(sent.mm_inputs.model_specific_tensors["image_embeds_hint"]),
        np.arange(50000, dtype=np.float32),
    )
    assert all(not s.path.exists() for s in leg.segments)  # read, so unlinked


def test_tensors_below_the_threshold_stay_inline(transports) -> None:
    leg = transports("shm", min_bytes=1 << 30).prepare(worker(), request(), pixels())
    assert leg.segments == [] and leg.pixels is not None and leg.pixels.shm is None


def test_a_leg_without_pixels_never_uses_shm(transports) -> None:
    req = request()
    leg = transports("shm", min_bytes=1).prepare(worker(), req, None)
    assert leg.request is req and leg.segments == []


def test_auto_only_for_workers_sharing_our_dev_shm(transports) -> None:
    auto = transports("auto")
    assert auto.uses_shm(worker(NS))
    assert not auto.uses_shm(worker("other-boot:42"))
    assert not auto.uses_shm(worker())  # a worker that advertises nothing
    # Without an id of our own, nothing matches (not even an empty label).
    assert not transports("auto", ns="").uses_shm(worker(""))
    # The gateway's own id is the one Tandem workers and vLLM's servicer compute.
    assert TensorTransport("auto").namespace_id == shm_namespace_id() != ""


def test_release_unlinks_segments_nobody_read(transports) -> None:
    leg = transports("shm").prepare(worker(), request(), pixels())
    paths = [s.path for s in leg.segments]
    assert paths and all(p.exists() for p in paths)
    leg.release()
    leg.release()  # idempotent
    assert not any(p.exists() for p in paths)


def test_a_failed_write_falls_back_to_inline_and_is_counted(transports, tmp_path: Path) -> None:
    gone = tmp_path / "shm"
    gone.mkdir()
    transport = transports("shm", writer=SegmentWriter(gone))
    gone.rmdir()  # writable when checked, gone when written
    failures = sample("tandem_mm_shm_write_failures_total")
    px = pixels()
    leg = transport.prepare(worker(), request(), px)
    assert leg.pixels is px and leg.segments == []
    tensors = leg.request.mm_inputs.model_specific_tensors
    assert tensors["image_embeds_hint"].WhichOneof("payload") == "inline"
    assert sample("tandem_mm_shm_write_failures_total") == failures + 2


def test_an_unwritable_directory_turns_shm_off(tmp_path: Path) -> None:
    transport = TensorTransport("shm", writer=SegmentWriter(tmp_path / "missing"))
    assert not transport.enabled and not transport.uses_shm(worker())
