"""The TensorRT-LLM servicer on a real worker server in this process, over the null engine.

The null engine loads no weights but keeps the real protocol, so the frames of both modes
with n = 2, every refusal as a gRPC status with its code, images decoded and placed, the
info calls, health, abort and the leg counters are checked here in a moment; answers of
the trained models are test_worker_trtllm_engine.py's.
"""

from __future__ import annotations

import ast
import io
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest
from PIL import Image
from smg_grpc_proto.generated import common_pb2

from tandem import __version__
from tandem.engine.protocol import Engine
from tandem.errors import WORKER_ERROR_CODE_KEY
from tandem.models.info import load_model_info
from tandem.wire.trtllm import trpb, trpb_grpc
from tandem.wire.worker_marker import TANDEM_WORKER_METADATA_KEY
from tandem.worker.config import WorkerConfig
from tandem.worker.kv_channel import KvChannelClient
from tandem.worker.server import WorkerServer

pytestmark = pytest.mark.timeout(60)
PD = trpb.DisaggregatedParams


@dataclass
class Worker:
    server: WorkerServer
    stub: trpb_grpc.TrtllmServiceStub


@pytest.fixture
async def start(qwen_meta_dir: Path) -> AsyncIterator[Callable[..., Awaitable[Worker]]]:
    """Start null-engine TensorRT-LLM workers (server, engine, KV side channel, marker)."""
    started: list[tuple[WorkerServer, grpc.aio.Channel]] = []

    async def start_worker(**config: object) -> Worker:
        server = WorkerServer(
            WorkerConfig(model=str(qwen_meta_dir), protocol="trtllm", engine="null", **config)  # type: ignore[arg-type]
        )
        await server.start()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
        started.append((server, channel))
        return Worker(server, trpb_grpc.TrtllmServiceStub(channel))

    yield start_worker
    for server, channel in reversed(started):
        await channel.close()
        await server.stop(0)


def request(
    rid: str, ids: list[int] | None = None, streaming: bool = True, max_tokens: int = 4
) -> trpb.GenerateRequest:
    """As Tandem's gateway writes it: beam width 1, every sampling scalar present."""
    req = trpb.GenerateRequest(request_id=rid, streaming=streaming, max_tokens=max_tokens)
    req.tokenized.input_token_ids.extend(ids or [5, 6, 7, 8])
    req.tokenized.original_text = "(not read)"
    sampling = req.sampling_config
    sampling.beam_width, sampling.num_return_sequences = 1, 1
    sampling.temperature, sampling.top_p, sampling.repetition_penalty = 0.0, 1.0, 1.0
    sampling.presence_penalty = sampling.frequency_penalty = 0.0
    req.output_config.exclude_input_from_output = True
    return req


def png(size: tuple[int, int] = (64, 48), seed: int = 0) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def with_image(req: trpb.GenerateRequest, model_dir: Path, run: int = 4) -> bytes:
    """One 64x48 picture (four Qwen3-VL tokens) with its run of ``run`` image tokens."""
    info = load_model_info(model_dir)
    blob = png()
    del req.tokenized.input_token_ids[:]
    req.tokenized.input_token_ids.extend([5, 259, *([info.image_token_id] * run), 260, 6])
    req.multimodal_input.image_data.append(blob)
    return blob


async def answer(worker: Worker, req: trpb.GenerateRequest) -> list[trpb.GenerateResponse]:
    return [frame async for frame in worker.stub.Generate(req, timeout=10)]


async def refusal(worker: Worker, req: trpb.GenerateRequest) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await answer(worker, req)
    return info.value


async def test_two_sequences_stream_chunks_then_one_complete_each(start) -> None:
    worker = await start()
    req = request("n2")
    req.sampling_config.num_return_sequences = 2
    frames = await answer(worker, req)
    assert {f.request_id for f in frames} == {"n2"}
    chunks = [f.chunk for f in frames if f.HasField("chunk")]
    completes = [f.complete for f in frames if f.HasField("complete")]
    assert sorted(c.sequence_index for c in completes) == [0, 1]
    for index in (0, 1):
        mine = [c for c in chunks if c.sequence_index == index]
        assert [c.completion_tokens for c in mine] == [1, 2, 3, 4], "counts are cumulative"
        done = next(c for c in completes if c.sequence_index == index)
        assert list(done.output_token_ids) == [t for c in mine for t in c.token_ids]
        assert (done.finish_reason, done.completion_tokens, done.prompt_tokens) == ("length", 4, 4)
    whole = await answer(worker, request("whole", streaming=False))
    assert len(whole) == 1 and whole[0].HasField("complete")
    assert list(whole[0].complete.output_token_ids) == [
        t for c in chunks if c.sequence_index == 0 for t in c.token_ids
    ]
    legs = worker.server.servicer.stats()["leg_bytes"]
    assert legs["aggregated"]["requests"] == 2 and legs["aggregated"]["message_bytes"] > 0
    assert legs["aggregated"]["image_bytes"] == legs["aggregated"]["pixel_bytes"] == 0


async def test_an_expanded_image_prompt_is_decoded_and_answered(start, qwen_meta_dir) -> None:
    worker = await start()
    req = request("image", streaming=False)
    blob = with_image(req, qwen_meta_dir)
    frames = await answer(worker, req)
    assert frames[-1].complete.completion_tokens == 4
    stats = worker.server.servicer.stats()
    assert stats["media_items_processed"] == 1
    assert stats["leg_bytes"]["aggregated"]["image_bytes"] == len(blob)


def _case(case: str, model_dir: Path) -> tuple[trpb.GenerateRequest, str, str]:
    """(the request, the message's words, the worker error code or "")."""
    req = request(f"refuse-{case}")
    if case == "stop":
        req.stop.append("\n")
        return req, "stop: this worker does not detokenize", "unsupported_parameter"
    if case == "context_only":
        req.disaggregated_params.request_type = PD.REQUEST_TYPE_CONTEXT_ONLY
        return req, "disaggregated_params.request_type", "runtime_pd_not_supported"
    if case == "generation_only":
        req.disaggregated_params.request_type = PD.REQUEST_TYPE_GENERATION_ONLY
        return req, "REQUEST_TYPE_GENERATION_ONLY", "runtime_pd_not_supported"
    if case == "beam":
        req.sampling_config.beam_width = 2
        return req, "sampling_config.beam_width 2", "unsupported_parameter"
    if case == "max_tokens":
        req.max_tokens = 0
        return req, "max_tokens is required", ""
    if case == "no_prompt":
        req.ClearField("tokenized")
        return req, "tokenized input must be provided", ""
    if case == "logprobs":
        req.output_config.logprobs = 2
        return req, "logprobs: the null engine of this worker has none", "unsupported_parameter"
    if case == "guided":
        req.guided_decoding.guide_type = trpb.GuidedDecodingParams.GUIDE_TYPE_REGEX
        req.guided_decoding.guide = "[a-z]+"
        return req, "structured outputs", "unsupported_parameter"
    if case == "bias":
        req.embedding_bias.extend([1.0, 2.0])
        return req, "embedding_bias has 2 values", ""
    if case == "short_run":
        with_image(req, model_dir, run=3)
        return req, "image_data[0] expands to 4 image tokens", "multimodal_prompt_contract_mismatch"
    if case == "no_images":
        with_image(req, model_dir)
        req.ClearField("multimodal_input")
        return req, "multimodal_input.image_data is empty", "multimodal_prompt_contract_mismatch"
    if case == "bad_image":
        with_image(req, model_dir)
        req.multimodal_input.image_data[0] = b"GIF89a but not really"
        return req, "multimodal_input.image_data[0]: ", "multimodal_processing_failed"
    raise AssertionError(case)


CASES = ["stop", "context_only", "generation_only", "beam", "max_tokens", "no_prompt"]
CASES += ["logprobs", "guided", "bias", "short_run", "no_images", "bad_image"]


@pytest.mark.parametrize("case", CASES)
async def test_refusals_are_invalid_argument_with_their_code(start, qwen_meta_dir, case) -> None:
    worker = await start()
    req, words, code = _case(case, qwen_meta_dir)
    err = await refusal(worker, req)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
    assert words in (err.details() or "")
    assert dict(err.trailing_metadata() or ()).get(WORKER_ERROR_CODE_KEY, "") == code
    health = await worker.stub.HealthCheck(trpb.HealthCheckRequest())
    assert health.status == "OK", "a refusal leaves the worker serving"


async def test_a_language_model_only_worker_refuses_images_and_lists_no_vision(
    start, qwen_meta_dir
) -> None:
    worker = await start(language_model_only=True)
    req = request("lmo")
    with_image(req, qwen_meta_dir)
    err = await refusal(worker, req)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "multimodal_input.image_data: this worker runs the language model only" in (
        err.details() or ""
    )
    assert dict(err.trailing_metadata() or ())[WORKER_ERROR_CODE_KEY] == "multimodal_not_supported"
    info = await worker.stub.GetModelInfo(trpb.GetModelInfoRequest())
    assert "vision" not in info.supported_features
    assert worker.server.servicer.stats()["media_items_processed"] == 0


async def test_the_info_calls_describe_the_worker(start) -> None:
    worker = await start(served_model_name="served-name")
    info = await worker.stub.GetModelInfo(trpb.GetModelInfoRequest())
    assert info.model_id == "served-name"
    assert (info.max_seq_len, info.max_input_len, info.vocab_size) == (4096, 4095, 263)
    assert (info.hidden_size, info.num_layers, info.num_heads) == (64, 2, 4)
    assert info.max_batch_size == 0
    features = set(info.supported_features)
    assert {"vision", "num_return_sequences", "embedding_bias", "cache_salt_id"} <= features
    assert not features & {"logprobs", "guided_decoding"}, "the null engine computes neither"
    call = worker.stub.GetServerInfo(trpb.GetServerInfoRequest())
    server = await call
    assert dict(await call.trailing_metadata())[TANDEM_WORKER_METADATA_KEY] == __version__
    assert (server.version, server.backend) == (f"tandem-{__version__}", "pytorch")
    sizes = (server.tensor_parallel_size, server.pipeline_parallel_size)
    assert (*sizes, server.context_parallel_size, server.world_size) == (1, 1, 1, 1)
    chunks = [c async for c in worker.stub.GetTokenizer(common_pb2.GetTokenizerRequest())]
    assert chunks[-1].sha256 and sum(len(c.data) for c in chunks) > 0
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await worker.stub.Embed(trpb.EmbedRequest(request_id="e"))
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "Embed is not implemented" in (err.value.details() or "")
    # A subscriber from sequence 0 gets the snapshot first (docs/worker-protocols.md,
    # "KV events"); the stream then stays open, so the test cancels it.
    events = worker.stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest(), timeout=10)
    first = await events.read()
    assert first.HasField("snapshot") and first.snapshot.index == 0
    events.cancel()


async def test_health_follows_the_engine(start) -> None:
    worker = await start()
    assert (await worker.stub.HealthCheck(trpb.HealthCheckRequest())).status == "OK"
    worker.server.engine.stop()
    assert (await worker.stub.HealthCheck(trpb.HealthCheckRequest())).status == "engine stopped"


async def test_abort_ends_every_sequence_and_says_whether_it_ran(start) -> None:
    worker = await start(null_token_delay_s=0.05)
    req = request("abort-me", max_tokens=500)
    req.sampling_config.num_return_sequences = 2
    call = worker.stub.Generate(req, timeout=10)
    assert (await call.read()).HasField("chunk")
    reply = await worker.stub.Abort(trpb.AbortRequest(request_id="abort-me"))
    assert reply.success and "aborted" in reply.message
    frames = []
    while (frame := await call.read()) is not grpc.aio.EOF:
        frames.append(frame)
    reasons = {
        f.complete.sequence_index: f.complete.finish_reason
        for f in frames
        if f.HasField("complete")
    }
    assert reasons == {0: "abort", 1: "abort"}
    unknown = await worker.stub.Abort(trpb.AbortRequest(request_id="never-sent"))
    assert not unknown.success and "no request never-sent is running" in unknown.message
    assert not (await worker.stub.Abort(trpb.AbortRequest())).success


async def test_the_stats_answer_has_the_other_adapters_keys(start, qwen_meta_dir) -> None:
    from tandem.worker.sglang.leg_counter import CountingSglangServicer

    worker = await start()
    engine = worker.server.engine
    sglang = CountingSglangServicer(
        WorkerConfig(engine="null"),
        load_model_info(qwen_meta_dir),
        engine,
        KvChannelClient(engine.shape),
        1,
    )
    assert set(worker.server.servicer.stats()) == set(sglang.stats())


WORKER = Path(__file__).parents[4] / "src" / "tandem" / "worker" / "trtllm"
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
