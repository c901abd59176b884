"""SGLang's messages on the gateway side: pixels spliced into the request bytes, frames
read into neutral ones, labels from the info calls, and the two PD legs of a room."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf.struct_pb2 import Struct

from tandem.gateway.backends.sglang.frames import frame_of
from tandem.gateway.backends.sglang.labels import model_id_of, worker_labels
from tandem.gateway.backends.sglang.pd import Bootstraps, pd_legs
from tandem.gateway.backends.sglang.splice import serialize_with_pixels
from tandem.gateway.workers.worker import Worker
from tandem.wire.pixels import PixelPayload
from tandem.wire.sglang import DEFAULT_BOOTSTRAP_PORT, ROOM_LIMIT, decode_tensor, spb
from tandem.wire.worker_marker import TANDEM_WORKER_LABEL


def image_request() -> spb.GenerateRequest:
    req = spb.GenerateRequest(request_id="r", stream=True)
    req.tokenized.input_ids.extend([1, 2, 2, 2, 3])
    req.mm_inputs.im_token_id = 2
    req.mm_inputs.mm_placeholders.add(offset=1, length=3)
    req.mm_inputs.modalities.append("image")
    grid = req.mm_inputs.model_specific_tensors["image_grid_thw"]
    grid.shape.extend([1, 3])
    grid.dtype = "int64"
    grid.data = np.array([[1, 2, 2]], dtype="<i8").tobytes()
    return req


def test_spliced_bytes_are_the_request_with_its_pixels() -> None:
    pixels = np.arange(24, dtype=np.float32).reshape(4, 6)
    req = image_request()
    wire = spb.GenerateRequest.FromString(
        serialize_with_pixels(req, PixelPayload.from_array(pixels))
    )
    expected = spb.GenerateRequest()
    expected.CopyFrom(req)
    tensor = expected.mm_inputs.pixel_values
    tensor.shape.extend([4, 6])
    tensor.dtype = "float32"
    tensor.data = pixels.tobytes()
    assert wire == expected
    assert np.array_equal(decode_tensor(wire.mm_inputs.pixel_values), pixels)
    assert not req.mm_inputs.HasField("pixel_values")  # the message itself stays pixel-free


def test_splicing_refuses_what_sglang_cannot_take() -> None:
    req = image_request()
    raw = PixelPayload.raw(np.zeros((2, 3), np.uint8), np.zeros((1, 256), np.float32), "float32")
    with pytest.raises(ValueError, match="normalized"):
        serialize_with_pixels(req, raw)
    req.mm_inputs.pixel_values.dtype = "float32"
    with pytest.raises(ValueError, match="already"):
        serialize_with_pixels(req, PixelPayload.from_array(np.zeros(2, np.float32)))


def test_frames_read_chunks_completions_and_skip_empty_ones() -> None:
    chunk = spb.GenerateResponse(
        chunk=spb.GenerateStreamChunk(token_ids=[4, 5], completion_tokens=2, index=1)
    )
    chunk.chunk.output_logprobs.token_ids.extend([4, 5])
    chunk.chunk.output_logprobs.token_logprobs.extend([-0.5, -1.0])
    frame = frame_of(chunk)
    assert frame is not None and not frame.final and list(frame.token_ids) == [4, 5]
    assert frame.index == 1 and frame.logprobs is not None
    assert [(e.token_id, e.logprob) for e in frame.logprobs()] == [(4, -0.5), (5, -1.0)]
    done = frame_of(
        spb.GenerateResponse(
            complete=spb.GenerateComplete(
                output_ids=[4, 5], finish_reason="length", prompt_tokens=7, cached_tokens=3
            )
        )
    )
    assert done is not None and done.final and done.finish_reason == "length"
    assert (done.prompt_tokens, done.cached_tokens) == (7, 3)
    assert frame_of(spb.GenerateResponse(request_id="r")) is None


def test_labels_come_from_model_info_and_the_server_args_that_describe_a_worker() -> None:
    args = Struct()
    args.update(
        {
            "disaggregation_mode": "prefill",
            "disaggregation_bootstrap_port": 9001,
            "tp_size": 1,
            "random_seed": 7,  # not a key a gateway reads
        }
    )
    model = spb.GetModelInfoResponse(
        model_path="/m/tiny-qwen3-vl", supports_vision=False, vocab_size=300
    )
    server = spb.GetServerInfoResponse(server_args=args, sglang_version="tandem-1")
    labels = worker_labels(model, server, "1.0")
    assert labels["disaggregation_bootstrap_port"] == "9001"
    assert labels["disaggregation_mode"] == "prefill" and labels["tp_size"] == "1"
    assert "random_seed" not in labels
    assert labels["supports_vision"] == "false" and labels["vocab_size"] == "300"
    assert labels["version"] == "tandem-1" and labels[TANDEM_WORKER_LABEL] == "1.0"
    assert model_id_of(model) == "tiny-qwen3-vl"
    assert model_id_of(spb.GetModelInfoResponse(served_model_name="x", model_path="/a/b")) == "x"


def prefill_worker(url: str, labels: dict[str, str] | None = None) -> Worker:
    return Worker(url=url, role="prefill", labels=labels or {}, model_id="m")


def test_both_legs_meet_at_one_room_and_only_prefill_carries_media() -> None:
    req = image_request()
    params = Bootstraps().params(prefill_worker("[::1]:5000"))
    prefill, decode = pd_legs(req, params)
    assert prefill.request_id == decode.request_id == "r"
    assert prefill.disaggregated_params == decode.disaggregated_params == params
    assert params.bootstrap_host == "::1" and 0 <= params.bootstrap_room < ROOM_LIMIT
    assert prefill.HasField("mm_inputs") and not decode.HasField("mm_inputs")
    assert list(decode.tokenized.input_ids) == list(req.tokenized.input_ids)
    assert prefill.stream and decode.stream  # both legs keep the client's stream flag
    assert not req.HasField("disaggregated_params")  # the request is left as it was


def test_rooms_differ_per_pair() -> None:
    boot = Bootstraps()
    rooms = {boot.params(prefill_worker("a:1")).bootstrap_room for _ in range(50)}
    assert len(rooms) > 45


def test_the_bootstrap_port_is_the_flags_then_the_workers_then_sglangs_default() -> None:
    boot = Bootstraps({"grpc://a:1": 7000, "b:2": None})
    stated = {"disaggregation_bootstrap_port": "7100"}
    assert boot.port(prefill_worker("a:1", stated)) == 7000
    assert boot.port(prefill_worker("b:2", stated)) == 7100
    assert boot.port(prefill_worker("c:3")) == DEFAULT_BOOTSTRAP_PORT
    assert boot.port(prefill_worker("c:3", {"disaggregation_bootstrap_port": "x"})) == 8998
