"""The gateway's E/P/D encode stage against real loopback gRPC servers that record what
they are sent: one ``Encode`` per item (one item, one room, its own pixel rows, an
``encode-…`` id), the prefill leg's ``encode_bootstrap_info`` naming the same rooms, a
repeated image sent to the same encode worker, and failures tried elsewhere then coded.

The servers are test doubles of an encode worker (they answer only the calls the stage
and the registry make); Tandem's real encode worker is tests/integration's."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc
import numpy as np
import pytest

from tandem.errors import TandemError
from tandem.gateway.backends.tokenspeed.epd import EncodeStage
from tandem.gateway.backends.tokenspeed.sender import TokenSpeedSender
from tandem.gateway.workers.registry import WorkerRegistry
from tandem.wire.pixels import PixelPayload
from tandem.wire.tokenspeed import (
    IMAGE,
    content_hash,
    decode_tensor,
    encode_into,
    epb,
    epb_grpc,
    tpb,
    tpb_grpc,
)


@dataclass
class _Encoder(epb_grpc.TokenSpeedEncoderServicer, tpb_grpc.TokenSpeedSchedulerServicer):
    accept: bool = True
    status: grpc.StatusCode | None = None
    seen: list[epb.EncodeRequest] = field(default_factory=list)

    async def Encode(self, request, context):
        self.seen.append(request)
        if self.status is not None:
            await context.abort(self.status, "encoder says no")
        return epb.EncodeResponse(accepted=self.accept)

    async def GetModelInfo(self, request, context):
        return tpb.GetModelInfoResponse(served_model_name="m", supports_vision=True)

    async def GetServerInfo(self, request, context):
        return tpb.GetServerInfoResponse(tokenspeed_version="double")

    async def HealthCheck(self, request, context):
        return tpb.HealthCheckResponse(healthy=True)


async def _serve(encoder: _Encoder) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    epb_grpc.add_TokenSpeedEncoderServicer_to_server(encoder, server)
    tpb_grpc.add_TokenSpeedSchedulerServicer_to_server(encoder, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


@pytest.fixture
async def encoders() -> AsyncIterator[tuple[WorkerRegistry, list[_Encoder], list[str]]]:
    doubles = [_Encoder(), _Encoder(), _Encoder()]
    served = [await _serve(d) for d in doubles]
    registry = WorkerRegistry(sender=TokenSpeedSender())
    for _, url in served:
        await registry.add(url, "encode")
    try:
        yield registry, doubles, [url for _, url in served]
    finally:
        await registry.close()
        for server, _ in served:
            await server.stop(0)


def request_of(hashes: list[str], rows: list[int]) -> tuple[tpb.GenerateRequest, PixelPayload]:
    req = tpb.GenerateRequest(request_id="chatcmpl-1")
    req.tokenized.input_ids.extend(range(10))
    for k, (h, n) in enumerate(zip(hashes, rows, strict=True)):
        item = req.mm_inputs.items.add(modality=IMAGE, content_hash=content_hash(h))
        item.placeholders.add(offset=k * 4, length=2)
        encode_into(item.model_specific_tensors["patches_per_image"], np.array([n]))
    pixels = np.arange(sum(rows) * 2, dtype=np.float32).reshape(sum(rows), 2)
    return req, PixelPayload.from_array(pixels)


async def test_each_item_is_encoded_once_and_the_prefill_leg_names_its_room(encoders) -> None:
    registry, doubles, urls = encoders
    req, pixels = request_of(["a" * 64, "b" * 64], [3, 1])
    chosen = await EncodeStage({urls[0]: 9100}).run(req, pixels, registry, "m", 5.0)
    sent = [r for d in doubles for r in d.seen]
    assert len(sent) == 2
    info = req.encode_bootstrap_info.items
    assert [e.item_index for e in info] == [0, 1]
    whole = np.asarray(pixels.array)
    for entry, url in zip(info, chosen, strict=True):
        (call,) = [r for r in sent if r.items[0].bootstrap_room == entry.bootstrap_room]
        assert call.request_id.startswith("encode-") and call.request_id != req.request_id
        assert len(call.items) == 1 and len(call.mm_inputs.items) == 1
        item = call.mm_inputs.items[0]
        assert item.content_hash == req.mm_inputs.items[entry.item_index].content_hash
        rows = slice(0, 3) if entry.item_index == 0 else slice(3, 4)
        assert np.array_equal(decode_tensor(item.encoder_input), whole[rows])
        assert entry.bootstrap_host == "127.0.0.1"
        assert entry.bootstrap_port == (9100 if url == urls[0] else 8998)
    assert all(not item.HasField("encoder_input") for item in req.mm_inputs.items)


async def test_a_repeated_image_goes_to_the_same_encode_worker(encoders) -> None:
    registry, _, _ = encoders
    stage = EncodeStage()
    picks = set()
    for _ in range(5):
        req, pixels = request_of(["c" * 64], [2])
        picks.update(await stage.run(req, pixels, registry, "m", 5.0))
    assert len(picks) == 1
    spread = set()
    for k in range(12):
        req, pixels = request_of([f"{k:064x}"], [2])
        spread.update(await stage.run(req, pixels, registry, "m", 5.0))
    assert len(spread) > 1  # different images spread over the pool


async def test_a_failing_encode_worker_is_tried_elsewhere(encoders) -> None:
    registry, doubles, urls = encoders
    stage = EncodeStage()
    req, pixels = request_of(["d" * 64], [2])
    (first,) = await stage.run(req, pixels, registry, "m", 5.0)
    doubles[urls.index(first)].status = grpc.StatusCode.UNAVAILABLE
    req, pixels = request_of(["d" * 64], [2])
    (second,) = await stage.run(req, pixels, registry, "m", 5.0)
    assert second != first


async def test_when_no_encode_worker_accepts_the_request_fails_coded(encoders) -> None:
    registry, doubles, _ = encoders
    for double in doubles:
        double.accept = False
    req, pixels = request_of(["e" * 64], [2])
    with pytest.raises(TandemError) as info:
        await EncodeStage(attempts=3).run(req, pixels, registry, "m", 5.0)
    assert info.value.code == "encode_worker_failed" and info.value.status == 502
    assert sum(len(d.seen) for d in doubles) == 3  # each worker tried once
    for double in doubles:
        double.status = grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(TandemError) as info:
        await EncodeStage().run(*request_of(["f" * 64], [2]), registry, "m", 5.0)
    assert info.value.status == 400  # the worker's refusal, not retried
    assert sum(len(d.seen) for d in doubles) == 4


async def test_no_encode_worker_is_a_503() -> None:
    registry = WorkerRegistry(sender=TokenSpeedSender())
    with pytest.raises(TandemError) as info:
        await EncodeStage().run(*request_of(["a" * 64], [1]), registry, "m", 1.0)
    assert info.value.code == "no_available_encode_workers" and info.value.status == 503
