"""The TokenSpeed servicer on real gRPC servers in this process, over the null engine.

The null engine loads no weights but keeps the real protocol, KV store and side channel,
so the legs, refusals, leg counters, the encode worker's discovery copy and the PD
handoff of text requests are checked here in a moment; images through PD, with real
forward passes, are tests/integration/test_worker_tokenspeed.py's.
"""

from __future__ import annotations

import ast
import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
from smg_grpc_proto.generated import common_pb2

from tandem.engine.kv_store import KvStore
from tandem.engine.null import NullEngine, null_shape
from tandem.engine.protocol import Engine
from tandem.engine.types import MediaInputs, MediaItem
from tandem.errors import WORKER_ERROR_CODE_KEY
from tandem.models.info import load_model_info
from tandem.wire.tokenspeed import IMAGE, encode_into, room_transfer_id, tpb, tpb_grpc
from tandem.worker.adapters import adapter_for
from tandem.worker.config import Role, WorkerConfig
from tandem.worker.context import ServedProtocol, WorkerContext
from tandem.worker.kv_channel import KvChannelClient, KvChannelServer
from tandem.worker.marker import server_interceptors
from tandem.worker.tokenspeed.info import SHALLOW_HEALTH

pytestmark = pytest.mark.timeout(30)


@dataclass
class Worker:
    address: str
    engine: NullEngine
    servicer: ServedProtocol
    stub: tpb_grpc.TokenSpeedSchedulerStub


@pytest.fixture
async def start(qwen_meta_dir: Path) -> AsyncIterator[Callable[..., Awaitable[Worker]]]:
    """Start TokenSpeed workers of a role (their own server, engine and KV side channel)."""
    cleanup: list[Callable[[], Awaitable[None]]] = []

    async def start_worker(role: Role = "both", token_delay_s: float = 0.0) -> Worker:
        # An encode worker needs the embedded engine's vision tower: it is
        # tests/integration/test_worker_tokenspeed.py's.
        config = WorkerConfig(
            model=str(qwen_meta_dir), protocol="tokenspeed", role=role, engine="null"
        )
        model = load_model_info(qwen_meta_dir)
        engine = NullEngine(model, KvStore(null_shape(model)), token_delay_s)
        client = KvChannelClient(engine.shape)
        adapter = adapter_for("tokenspeed")
        server = grpc.aio.server(
            interceptors=server_interceptors(False, adapter.server_info_method)
        )
        port = server.add_insecure_port("127.0.0.1:0")
        context = WorkerContext(
            config, qwen_meta_dir, model, engine, client, ("127.0.0.1", port), port
        )
        servicer = adapter.serve(context, server)
        kv = KvChannelServer(engine.kv_store, engine.shape, servicer.stats)
        server.add_generic_rpc_handlers((kv.handler(),))
        engine.start()
        await server.start()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")

        async def stop() -> None:
            await channel.close()
            await client.close()
            await server.stop(0)
            engine.stop()

        cleanup.append(stop)
        stub = tpb_grpc.TokenSpeedSchedulerStub(channel)
        return Worker(f"127.0.0.1:{port}", engine, servicer, stub)

    yield start_worker
    for stop in reversed(cleanup):
        await stop()


def request(
    rid: str, ids: list[int] | None = None, stream: bool = True, **sampling: object
) -> tpb.GenerateRequest:
    req = tpb.GenerateRequest(request_id=rid, stream=stream, logprob_start_len=-1)
    req.tokenized.input_ids.extend(ids or [5, 6, 7, 8])
    req.sampling_params.temperature = 0.0
    req.sampling_params.max_new_tokens = 4
    for name, value in sampling.items():
        setattr(req.sampling_params, name, value)
    return req


def with_room(req: tpb.GenerateRequest, address: str, room: int) -> tpb.GenerateRequest:
    leg = tpb.GenerateRequest.FromString(req.SerializeToString())
    host, port = address.rsplit(":", 1)
    leg.kv_bootstrap_info.bootstrap_host = host
    leg.kv_bootstrap_info.bootstrap_port = int(port)
    leg.kv_bootstrap_info.bootstrap_room = room
    return leg


def add_item(req: tpb.GenerateRequest, offset: int, length: int, pixels: bool = True) -> None:
    item = req.mm_inputs.items.add(modality=IMAGE)
    item.placeholders.add(offset=offset, length=length)
    if pixels:
        encode_into(item.encoder_input, np.zeros((4, 8), dtype=np.float32))


async def answer(worker: Worker, req: tpb.GenerateRequest) -> list[tpb.GenerateResponse]:
    return [frame async for frame in worker.stub.Generate(req, timeout=10)]


async def refusal(worker: Worker, req: tpb.GenerateRequest) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await answer(worker, req)
    return info.value


async def test_an_aggregated_answer_streams_chunks_then_a_complete(start) -> None:
    worker = await start()
    frames = await answer(worker, request("agg"))
    chunks = [f.chunk for f in frames if f.HasField("chunk")]
    complete = frames[-1].complete
    assert {f.request_id for f in frames} == {"agg"} and len(chunks) == 4
    assert [c.completion_tokens for c in chunks] == [1, 2, 3, 4], "counts are cumulative"
    assert list(complete.output_ids) == list(chunks[-1].token_ids)
    assert (complete.finish_reason, complete.completion_tokens) == ("length", 4)
    whole = await answer(worker, request("whole", stream=False))
    assert len(whole) == 1
    assert list(whole[0].complete.output_ids) == [t for c in chunks for t in c.token_ids]
    legs = worker.servicer.stats()["leg_bytes"]
    assert legs["aggregated"]["requests"] == 2 and legs["aggregated"]["pixel_bytes"] == 0
    assert legs["aggregated"]["message_bytes"] > 0


async def test_pd_text_over_a_room_and_the_decode_leg_carries_no_pixels(start) -> None:
    prefill, decode = await start("prefill"), await start("decode")
    req = with_room(request("pd"), prefill.address, room=(1 << 63) - 2)
    first, second = await asyncio.gather(answer(prefill, req), answer(decode, req))
    assert len(first[-1].complete.output_ids) == 1, "the prefill answers one token"
    assert second[-1].complete.completion_tokens == 4
    assert prefill.servicer.stats()["held_transfers"] == 0, "the pull released the KV"
    assert decode.servicer.stats()["leg_bytes"]["decode"]["pixel_bytes"] == 0
    assert prefill.servicer.stats()["leg_bytes"]["prefill"]["requests"] == 1
    health = await prefill.stub.HealthCheck(tpb.HealthCheckRequest())
    assert health.healthy and health.message == SHALLOW_HEALTH


async def test_a_decode_leg_must_carry_as_many_items_as_its_prefill_holds(start) -> None:
    prefill, decode = await start("prefill"), await start("decode")
    ids = [5, 6, 7, 8, 9, 10]
    held = MediaInputs([MediaItem("a", 1, 2), MediaItem("b", 3, 2)], im_token_id=3)
    zeros = torch.zeros(1, len(ids), 1)
    prefill.engine.kv_store.put(room_transfer_id("count", 7), [(zeros, zeros)], ids, [], held)
    leg = with_room(request("count", ids), prefill.address, room=7)
    add_item(leg, 1, 2, pixels=False)
    err = await refusal(decode, leg)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "carries 1 mm_inputs item(s) but its prefill holds KV for 2" in (err.details() or "")
    assert prefill.servicer.stats()["held_transfers"] == 0, "no KV is left held"


async def test_a_decode_leg_refused_before_its_pull_frees_the_prefill_kv(start) -> None:
    prefill, decode = await start("prefill"), await start("decode")
    req = with_room(request("freed"), prefill.address, room=3)
    await answer(prefill, req)
    assert prefill.servicer.stats()["held_transfers"] == 1
    bad = tpb.GenerateRequest.FromString(req.SerializeToString())
    bad.encode_bootstrap_info.SetInParent()
    err = await refusal(decode, bad)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "encode_bootstrap_info sent on a decode leg" in (err.details() or "")
    assert prefill.servicer.stats()["held_transfers"] == 0


NO_ITEMS = "encode_bootstrap_info needs mm_inputs items"


@pytest.mark.parametrize(
    ("role", "change", "words", "code"),
    [
        ("both", lambda r: r.sampling_params.stop.append("x"), "sampling_params.stop", "u"),
        ("both", lambda r: setattr(r, "data_parallel_rank", 2), "data_parallel_rank 2", ""),
        ("both", lambda r: r.kv_bootstrap_info.SetInParent(), "not disaggregated", ""),
        ("both", lambda r: add_item(r, 1, 2, pixels=False), r"items[0] has no encoder_input", ""),
        ("both", lambda r: r.encode_bootstrap_info.SetInParent(), NO_ITEMS, ""),
        ("prefill", lambda r: r.encode_bootstrap_info.SetInParent(), NO_ITEMS, ""),
        ("both", lambda r: add_item(r, 1, 2), "carries no image_grid_thw", ""),
    ],
)
async def test_refusals_are_invalid_argument(start, role, change, words, code) -> None:
    worker = await start(role)
    req = request("refused")
    if role == "prefill":
        req = with_room(req, worker.address, room=1)
    change(req)
    err = await refusal(worker, req)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
    assert words in (err.details() or "")
    expected = "unsupported_parameter" if code else ""
    assert dict(err.trailing_metadata() or ()).get(WORKER_ERROR_CODE_KEY, "") == expected
    assert worker.engine.kv_store.held_count == 0


async def test_loads_abort_and_the_calls_not_served(start) -> None:
    worker = await start(token_delay_s=0.05)
    loads = await worker.stub.GetLoads(tpb.GetLoadsRequest(dp_rank=0))
    assert [load.dp_rank for load in loads.loads] == [0]
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await worker.stub.GetLoads(tpb.GetLoadsRequest(dp_rank=1))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    call = worker.stub.Generate(request("abort-me", max_new_tokens=500), timeout=10)
    assert (await call.read()).HasField("chunk")
    reply = await worker.stub.Abort(tpb.AbortRequest(request_id="abort-me", reason="test"))
    assert reply.success
    frames = []
    while (frame := await call.read()) is not grpc.aio.EOF:
        frames.append(frame)
    assert frames[-1].complete.finish_reason == "abort"
    # FlushCache is served (docs/worker-protocols.md, "KV events"); this servicer was built
    # without a prefix cache or publisher, as --no-kv-events builds it.
    flushed = await worker.stub.FlushCache(common_pb2.FlushCacheRequest())
    assert not flushed.success and "no prefix cache" in flushed.message
    for method, message in (
        ("StartProfile", common_pb2.StartProfileRequest()),
        ("StopProfile", common_pb2.StopProfileRequest()),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await getattr(worker.stub, method)(message)
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in worker.stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest()):
            pass
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    chunks = [c async for c in worker.stub.GetTokenizer(common_pb2.GetTokenizerRequest())]
    assert chunks[-1].sha256 and sum(len(c.data) for c in chunks) > 0


async def test_the_stats_answer_has_the_other_adapters_keys(start, qwen_meta_dir: Path) -> None:
    from tandem.worker.sglang.leg_counter import CountingSglangServicer

    worker = await start()
    model = load_model_info(qwen_meta_dir)
    sglang = CountingSglangServicer(
        WorkerConfig(engine="null"), model, worker.engine, KvChannelClient(worker.engine.shape), 1
    )
    assert set(worker.servicer.stats()) == set(sglang.stats())


WORKER = Path(__file__).parents[4] / "src" / "tandem" / "worker" / "tokenspeed"
CONCRETE = {"tandem.engine.core", "tandem.engine.null", "tandem.engine.runner"}
CONCRETE |= {"tandem.engine.prefix_cache"}


@pytest.mark.parametrize("name", sorted(p.name for p in WORKER.glob("*.py")))
def test_the_adapter_uses_the_engine_protocol_only(name: str) -> None:
    """The process builds the concrete engine; the adapter reads only ``Engine``'s members."""
    tree = ast.parse((WORKER / name).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not imported & CONCRETE, f"{name} imports {sorted(imported & CONCRETE)}"
    members = {m for m in dir(Engine) if not m.startswith("_")}
    used = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Attribute | ast.Name)
        and (getattr(node.value, "attr", None) or getattr(node.value, "id", None)) == "engine"
    }
    assert used <= members, f"{name} reads {sorted(used - members)} off its engine"
