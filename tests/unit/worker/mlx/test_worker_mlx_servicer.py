"""Tandem's MLX servicer on real gRPC servers in this process.

Over the null engine (no weights, the real protocol): the answer's shapes (one token per
chunk with cumulative counts, then a ``complete`` with no ids; not streamed, one
``complete`` with them all), the refusals by field, ``max_tokens`` unset filling the
context, an ``Abort`` by ids ending the stream without a ``complete`` (as MLX's servicer
ends it), the info calls, the marker, the stats. Over the embedded engine with the trained
tiny-qwen3-vl: logprobs in MLX's shape, a stop token named in ``matched_stop_token_id``, the
seed. The gateway in front of real worker processes is tests/integration/test_gateway_mlx.py.
"""

from __future__ import annotations

import ast
import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from smg_grpc_proto.generated import common_pb2

from tandem.engine.core import EmbeddedEngine
from tandem.engine.kv_store import KvStore
from tandem.engine.null import NullEngine, null_shape
from tandem.engine.prefix_cache import PrefixCache
from tandem.engine.protocol import Engine
from tandem.engine.runner import ModelRunner
from tandem.errors import WORKER_ERROR_CODE_KEY
from tandem.models.info import load_model_info
from tandem.wire.mlx import mpb, mpb_grpc
from tandem.wire.worker_marker import TANDEM_WORKER_METADATA_KEY
from tandem.worker.adapters import adapter_for
from tandem.worker.config import WorkerConfig
from tandem.worker.context import ServedProtocol, WorkerContext
from tandem.worker.kv_channel import KvChannelClient, KvChannelServer
from tandem.worker.marker import server_interceptors

pytestmark = pytest.mark.timeout(60)


@dataclass
class Worker:
    address: str
    engine: Engine
    servicer: ServedProtocol
    stub: mpb_grpc.MlxEngineStub


Start = Callable[..., Awaitable[Worker]]


@pytest.fixture
async def start() -> AsyncIterator[Start]:
    """Start MLX workers over a given model directory and engine kind."""
    cleanup: list[Callable[[], Awaitable[None]]] = []

    async def start_worker(
        model_dir: Path, kind: str = "null", token_delay_s: float = 0.0, served: str | None = None
    ) -> Worker:
        config = WorkerConfig(
            model=str(model_dir),
            protocol="mlx",
            engine="null" if kind == "null" else "embedded",
            served_model_name=served,
        )
        model = load_model_info(model_dir)
        engine: Engine
        if kind == "null":
            engine = NullEngine(model, KvStore(null_shape(model)), token_delay_s)
        else:
            runner = ModelRunner.load(model_dir)
            engine = EmbeddedEngine(
                runner, PrefixCache(runner.shape, 1 << 20), KvStore(runner.shape)
            )
        client = KvChannelClient(engine.shape)
        adapter = adapter_for("mlx")
        server = grpc.aio.server(
            interceptors=server_interceptors(False, adapter.server_info_method)
        )
        port = server.add_insecure_port("127.0.0.1:0")
        context = WorkerContext(config, model_dir, model, engine, client, ("127.0.0.1", port), port)
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
        return Worker(f"127.0.0.1:{port}", engine, servicer, mpb_grpc.MlxEngineStub(channel))

    yield start_worker
    for stop in reversed(cleanup):
        await stop()


def request(
    rid: str, ids: list[int] | None = None, stream: bool = True, **sampling: object
) -> mpb.GenerateRequest:
    req = mpb.GenerateRequest(request_id=rid, stream=stream)
    req.tokenized.input_ids.extend(ids or [5, 6, 7, 8])
    req.sampling_params.temperature = 0.0
    req.sampling_params.max_tokens = 4
    for name, value in sampling.items():
        if name == "stop_token_ids":
            req.sampling_params.stop_token_ids.extend(value)  # type: ignore[arg-type]
        elif value is None:
            req.sampling_params.ClearField(name)
        else:
            setattr(req.sampling_params, name, value)
    return req


async def answer(worker: Worker, req: mpb.GenerateRequest) -> list[mpb.GenerateResponse]:
    return [frame async for frame in worker.stub.Generate(req, timeout=30)]


async def refusal(worker: Worker, req: mpb.GenerateRequest) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await answer(worker, req)
    return info.value


async def test_streamed_one_token_a_chunk_then_an_empty_complete(start, qwen_meta_dir) -> None:
    worker = await start(qwen_meta_dir)
    frames = await answer(worker, request("s", max_tokens=5))
    chunks = [f.chunk for f in frames[:-1]]
    assert all(f.HasField("chunk") for f in frames[:-1]) and frames[-1].HasField("complete")
    assert [len(c.token_ids) for c in chunks] == [1] * 5
    assert [c.completion_tokens for c in chunks] == [1, 2, 3, 4, 5], "counts are cumulative"
    assert {(c.prompt_tokens, c.index) for c in chunks} == {(4, 0)}
    done = frames[-1].complete
    assert list(done.output_ids) == [], "the chunks carried the ids"
    assert (done.finish_reason, done.prompt_tokens, done.completion_tokens) == ("length", 4, 5)
    assert not done.HasField("matched_stop_token_id") and not done.HasField("output_logprobs")
    whole = await answer(worker, request("w", stream=False, max_tokens=5))
    assert len(whole) == 1 and whole[0].HasField("complete")
    assert list(whole[0].complete.output_ids) == [c.token_ids[0] for c in chunks]
    assert whole[0].complete.completion_tokens == 5
    legs = worker.servicer.stats()["leg_bytes"]["aggregated"]
    assert legs["requests"] == 2 and legs["message_bytes"] > 0 and legs["pixel_bytes"] == 0


async def test_max_tokens_unset_fills_the_context(start, qwen_meta_dir) -> None:
    worker = await start(qwen_meta_dir)
    frames = await answer(worker, request("fill", stream=False, max_tokens=None))
    done = frames[-1].complete
    context = worker.engine.shape.max_context
    assert (done.finish_reason, done.completion_tokens) == ("length", context - 4)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda r: setattr(r, "text", "Hi"), "requires tokenized input"),
        (lambda r: r.tokenized.ClearField("input_ids"), "input_ids is empty"),
        (lambda r: setattr(r.sampling_params, "top_p", 2.0), "sampling_params.top_p"),
        (lambda r: setattr(r.sampling_params, "logprobs", 30), "sampling_params.logprobs"),
        (lambda r: r.sampling_params.logit_bias.update({10**6: 1.0}), "logit_bias"),
        (lambda r: setattr(r.sampling_params, "max_tokens", 0), "max_tokens must be"),
    ],
)
async def test_refusals_name_the_field(start, qwen_meta_dir, change, words) -> None:
    worker = await start(qwen_meta_dir)
    req = request("bad")
    change(req)
    err = await refusal(worker, req)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert words in (err.details() or "")


async def test_image_placeholders_and_an_overlong_prompt_are_refused(start, qwen_meta_dir):
    worker = await start(qwen_meta_dir)
    image = load_model_info(qwen_meta_dir).image_token_id
    err = await refusal(worker, request("img", [5, image, 6]))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "carries no media" in (err.details() or "")
    context = worker.engine.shape.max_context
    err = await refusal(worker, request("long", [5] * context))
    assert "leaves no room in the context" in (err.details() or "")


async def test_logprobs_from_an_engine_without_them_are_refused(start, qwen_meta_dir) -> None:
    worker = await start(qwen_meta_dir)
    err = await refusal(worker, request("lp", logprobs=2))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert dict(err.trailing_metadata() or ())[WORKER_ERROR_CODE_KEY] == "unsupported_parameter"


async def test_an_abort_by_ids_ends_the_stream_without_a_complete(start, qwen_meta_dir) -> None:
    worker = await start(qwen_meta_dir, token_delay_s=0.05)
    call = worker.stub.Generate(request("a1", max_tokens=500), timeout=10)
    assert (await call.read()).HasField("chunk")
    info = await worker.stub.GetServerInfo(mpb.GetServerInfoRequest())
    assert info.active_requests == 1
    await worker.stub.Abort(mpb.AbortRequest(request_ids=["a1", "never-seen"]))
    rest = []
    while (frame := await call.read()) is not grpc.aio.EOF:
        rest.append(frame)
    assert not any(f.HasField("complete") for f in rest)
    assert await call.code() == grpc.StatusCode.OK
    for _ in range(50):
        info = await worker.stub.GetServerInfo(mpb.GetServerInfoRequest())
        if info.active_requests == 0:
            break
        await asyncio.sleep(0.02)
    assert info.active_requests == 0
    assert worker.servicer.stats()["requests_by_outcome"].get("abort") == 1


async def test_the_info_calls(start, qwen_meta_dir) -> None:
    worker = await start(qwen_meta_dir, served="my-model")
    model = load_model_info(qwen_meta_dir)
    health = await worker.stub.HealthCheck(mpb.HealthCheckRequest())
    assert (health.healthy, health.message) == (True, "OK")
    info = await worker.stub.GetModelInfo(mpb.GetModelInfoRequest())
    assert info.model_path == str(qwen_meta_dir) and info.served_model_name == "my-model"
    assert info.is_generation and info.model_type == model.model_type
    assert info.max_context_length == model.max_context > 0
    assert info.max_req_input_len == model.max_context - 1
    assert info.vocab_size == model.vocab_size > 0
    assert list(info.eos_token_ids) == list(model.eos_token_ids)
    assert list(info.architectures) == ["Qwen3VLForConditionalGeneration"]
    call = worker.stub.GetServerInfo(mpb.GetServerInfoRequest())
    server = await call
    assert server.server_type == "tandem-mlx-grpc" and server.uptime_seconds > 0
    assert dict(await call.trailing_metadata() or ()).get(TANDEM_WORKER_METADATA_KEY)
    chunks = [c async for c in worker.stub.GetTokenizer(common_pb2.GetTokenizerRequest())]
    assert chunks[-1].sha256 and sum(len(c.data) for c in chunks) > 0
    worker.engine.stop()
    health = await worker.stub.HealthCheck(mpb.HealthCheckRequest())
    assert (health.healthy, health.message) == (False, "engine stopped")


async def test_the_stats_answer_has_the_other_adapters_keys(start, qwen_meta_dir) -> None:
    from tandem.worker.sglang.leg_counter import CountingSglangServicer

    worker = await start(qwen_meta_dir)
    model = load_model_info(qwen_meta_dir)
    sglang = CountingSglangServicer(
        WorkerConfig(engine="null"), model, worker.engine, KvChannelClient(worker.engine.shape), 1
    )
    assert set(worker.servicer.stats()) == set(sglang.stats())


async def test_logprobs_a_matched_stop_token_and_the_seed(start, qwen_dir) -> None:
    worker = await start(qwen_dir, kind="embedded")
    streamed = await answer(worker, request("lp", max_tokens=4, logprobs=2))
    chunks = [f.chunk for f in streamed if f.HasField("chunk")]
    ids = [c.token_ids[0] for c in chunks]
    for chunk in chunks:
        lp = chunk.output_logprobs
        assert list(lp.token_ids) == list(chunk.token_ids) and len(lp.token_logprobs) == 1
        [top] = lp.top_logprobs
        assert len(top.token_ids) == 2 and list(top.values) == sorted(top.values, reverse=True)
        # Greedy: the sampled token is the best alternative, with the same value.
        assert top.token_ids[0] == chunk.token_ids[0]
        assert top.values[0] == pytest.approx(lp.token_logprobs[0])
    whole = (await answer(worker, request("lp2", stream=False, max_tokens=4, logprobs=2)))[0]
    assert list(whole.complete.output_ids) == ids
    aggregated = whole.complete.output_logprobs
    assert list(aggregated.token_ids) == ids and len(aggregated.top_logprobs) == 4
    assert list(aggregated.token_logprobs) == pytest.approx(
        [c.output_logprobs.token_logprobs[0] for c in chunks]
    )
    # A stop token ends the sample, stays in the ids and is named.
    stopped = (await answer(worker, request("st", stream=False, stop_token_ids=[ids[1]])))[0]
    assert list(stopped.complete.output_ids) == ids[:2]
    assert stopped.complete.finish_reason == "stop"
    assert stopped.complete.matched_stop_token_id == ids[1]
    # A seed draws the same tokens again; another seed (almost surely) others.
    seeded = [
        list(
            (
                await answer(
                    worker, request(f"s{i}", stream=False, temperature=1.0, seed=s, max_tokens=12)
                )
            )[0].complete.output_ids
        )
        for i, s in enumerate((7, 7, 8))
    ]
    assert seeded[0] == seeded[1] and seeded[0] != seeded[2]


WORKER = Path(__file__).parents[4] / "src" / "tandem" / "worker" / "mlx"
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
