"""TokenSpeed's messages on the gateway side: each item's pixels spliced into the request
bytes, the decode clone (metadata kept, encoder input dropped), the rooms of a PD pair,
labels from the info calls."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf.struct_pb2 import Struct

from tandem.gateway.backends.tokenspeed.labels import model_id_of, worker_labels
from tandem.gateway.backends.tokenspeed.pd import KvBootstraps, decode_clone, pd_legs
from tandem.gateway.backends.tokenspeed.splice import serialize_with_pixels
from tandem.gateway.workers.worker import Worker
from tandem.wire.pixels import PixelPayload
from tandem.wire.tokenspeed import (
    DEFAULT_BOOTSTRAP_PORT,
    IMAGE,
    ROOM_LIMIT,
    content_hash,
    decode_tensor,
    encode_into,
    epb,
    tpb,
)
from tandem.wire.worker_marker import TANDEM_WORKER_LABEL


def two_image_request(patches: tuple[int, int] = (4, 2)) -> tpb.GenerateRequest:
    """Two qwen-style items: per-item grids and patch counts, no pixels yet."""
    req = tpb.GenerateRequest(request_id="r", stream=True)
    req.tokenized.input_ids.extend([1, 2, 2, 3, 2, 4])
    for k, (offset, rows) in enumerate(zip((1, 4), patches, strict=True)):
        item = req.mm_inputs.items.add(modality=IMAGE, content_hash=content_hash(f"{k:064x}"))
        item.placeholders.add(offset=offset, length=2 - k)
        item.placeholder_token_id = 2
        encode_into(item.model_specific_tensors["patches_per_image"], np.array([rows]))
        encode_into(item.model_specific_tensors["image_grid_thw"], np.array([[1, rows, 1]]))
    return req


def test_each_item_gets_its_own_rows_spliced_in() -> None:
    pixels = np.arange(36, dtype=np.float32).reshape(6, 6)
    req = two_image_request()
    wire = tpb.GenerateRequest.FromString(
        serialize_with_pixels(req, PixelPayload.from_array(pixels))
    )
    expected = tpb.GenerateRequest()
    expected.CopyFrom(req)
    encode_into(expected.mm_inputs.items[0].encoder_input, pixels[:4])
    encode_into(expected.mm_inputs.items[1].encoder_input, pixels[4:])
    assert wire == expected
    assert np.array_equal(decode_tensor(wire.mm_inputs.items[1].encoder_input), pixels[4:])
    assert not req.mm_inputs.items[0].HasField("encoder_input")  # the message stays pixel-free


def test_a_batched_layout_gives_each_item_one_row() -> None:
    pixels = np.arange(2 * 3 * 2 * 2, dtype=np.float32).reshape(2, 3, 2, 2)
    req = tpb.GenerateRequest(request_id="r")
    for _ in range(2):
        req.mm_inputs.items.add(modality=IMAGE).placeholders.add(offset=0, length=1)
    wire = tpb.GenerateRequest.FromString(
        serialize_with_pixels(req, PixelPayload.from_array(pixels))
    )
    for k in range(2):
        assert np.array_equal(
            decode_tensor(wire.mm_inputs.items[k].encoder_input), pixels[k : k + 1]
        )


def test_an_encode_request_is_spliced_too() -> None:
    pixels = np.ones((4, 6), dtype=np.float32)
    req = epb.EncodeRequest(request_id="encode-1")
    req.mm_inputs.items.add().CopyFrom(two_image_request().mm_inputs.items[0])
    req.items.add(bootstrap_room=7)
    wire = epb.EncodeRequest.FromString(serialize_with_pixels(req, PixelPayload.from_array(pixels)))
    assert wire.items[0].bootstrap_room == 7 and wire.request_id == "encode-1"
    assert np.array_equal(decode_tensor(wire.mm_inputs.items[0].encoder_input), pixels)


def test_splicing_refuses_rows_that_do_not_add_up() -> None:
    req = two_image_request()
    with pytest.raises(ValueError, match="own 6 of the 7"):
        serialize_with_pixels(req, PixelPayload.from_array(np.zeros((7, 6), np.float32)))
    with pytest.raises(ValueError, match="more than"):
        serialize_with_pixels(req, PixelPayload.from_array(np.zeros((5, 6), np.float32)))
    raw = PixelPayload.raw(np.zeros((6, 6), np.uint8), np.zeros((1, 256), np.float32), "float32")
    with pytest.raises(ValueError, match="normalized"):
        serialize_with_pixels(req, raw)


def test_the_decode_clone_keeps_item_metadata_and_drops_the_encoder_input() -> None:
    """On populated tensors, as the reference's review asked: every item keeps modality,
    hash, model tensors, placeholders and token id; only its encoder_input goes; the
    request id and the KV room stay; the E/P/D bootstrap goes."""
    prefill = two_image_request()
    prefill.kv_bootstrap_info.bootstrap_room = 12345
    prefill.encode_bootstrap_info.items.add(item_index=0, bootstrap_room=9)
    pixels = np.arange(36, dtype=np.float32).reshape(6, 6)
    encode_into(prefill.mm_inputs.items[0].encoder_input, pixels[:4])
    encode_into(prefill.mm_inputs.items[1].encoder_input, pixels[4:])
    decode = decode_clone(prefill)
    assert decode.request_id == prefill.request_id == "r"
    assert decode.kv_bootstrap_info == prefill.kv_bootstrap_info
    assert not decode.HasField("encode_bootstrap_info")
    assert len(decode.mm_inputs.items) == 2
    for before, after in zip(prefill.mm_inputs.items, decode.mm_inputs.items, strict=True):
        assert before.HasField("encoder_input") and not after.HasField("encoder_input")
        assert after.modality == before.modality == IMAGE
        assert after.content_hash == before.content_hash and len(after.content_hash) == 32
        assert after.placeholders == before.placeholders
        assert after.placeholder_token_id == before.placeholder_token_id == 2
        assert dict(after.model_specific_tensors) == dict(before.model_specific_tensors)
        assert decode_tensor(after.model_specific_tensors["image_grid_thw"]).shape == (1, 3)
    assert decode.ByteSize() < prefill.ByteSize() - pixels.nbytes + 64


def worker(url: str, labels: dict[str, str] | None = None) -> Worker:
    return Worker(url=url, role="prefill", labels=labels or {}, model_id="m")


def test_both_legs_meet_at_one_63_bit_room_with_no_rank_pin() -> None:
    req = two_image_request()
    req.data_parallel_rank = 1
    info = KvBootstraps().info(worker("[::1]:5000"))
    prefill, decode = pd_legs(req, info)
    assert prefill.kv_bootstrap_info == decode.kv_bootstrap_info == info
    assert info.bootstrap_host == "::1" and info.bootstrap_port == DEFAULT_BOOTSTRAP_PORT
    assert 0 <= info.bootstrap_room < ROOM_LIMIT
    assert not prefill.HasField("data_parallel_rank")
    assert not decode.HasField("data_parallel_rank")
    assert prefill.stream and decode.stream
    assert not req.HasField("kv_bootstrap_info")  # the request is left as it was
    rooms = {KvBootstraps().info(worker("a:1")).bootstrap_room for _ in range(50)}
    assert len(rooms) == 50 and max(rooms) > 1 << 40  # drawn from the 63-bit range


def test_the_bootstrap_port_is_the_flags_then_the_workers_then_the_default() -> None:
    boot = KvBootstraps({"grpc://a:1": 7000, "b:2": None})
    stated = {"disaggregation_bootstrap_port": "7100"}
    assert boot.info(worker("a:1", stated)).bootstrap_port == 7000
    assert boot.info(worker("b:2", stated)).bootstrap_port == 7100
    assert boot.info(worker("c:3")).bootstrap_port == DEFAULT_BOOTSTRAP_PORT


def test_labels_come_from_both_info_calls() -> None:
    args = Struct()
    args.update({"disaggregation_mode": "encode", "dp_size": 1, "random_seed": 7})
    scheduler = Struct()
    scheduler.update({"shm_namespace_id": "ns-1", "other": 2})
    model = tpb.GetModelInfoResponse(model_path="/m/tiny", supports_vision=True)
    server = tpb.GetServerInfoResponse(
        server_args=args, scheduler_info=scheduler, tokenspeed_version="tandem-1"
    )
    labels = worker_labels(model, server, "1.0")
    assert labels["disaggregation_mode"] == "encode" and labels["dp_size"] == "1"
    assert labels["shm_namespace_id"] == "ns-1" and "other" not in labels
    assert "random_seed" not in labels and labels["supports_vision"] == "true"
    assert labels["version"] == "tandem-1" and labels[TANDEM_WORKER_LABEL] == "1.0"
    assert labels["constrained_decoding"] == "requested" and labels["protocol"] == "tokenspeed"
    assert model_id_of(model) == "tiny"
