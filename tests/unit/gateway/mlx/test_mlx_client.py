"""The MLX client against a loopback gRPC server that answers in the shapes of MLX's own
servicer (one token per chunk, a streamed ``complete`` with empty ``output_ids``, a single
``complete`` otherwise, no request id, ``index`` 0, the served name set to the model's path,
a context of 0): the answer the gateway collects from it, streamed and not, the fan-out of
n > 1, the abort on a dropped stream, a stream that ends without its ``complete``, and the
calls the protocol has and has not. Tandem's own MLX worker is
tests/unit/worker/mlx/test_worker_mlx_servicer.py's."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from tandem.gateway.backends.mlx.backend import MlxBackend
from tandem.gateway.backends.mlx.client import MlxClient
from tandem.gateway.backends.mlx.leg import MlxLeg
from tandem.gateway.context import RequestContext
from tandem.gateway.endpoints.chat.schema import ChatCompletionRequest
from tandem.gateway.model import ModelHandle
from tandem.gateway.pipeline.prompt import build_prompt
from tandem.gateway.pipeline.respond import Collector
from tandem.wire.mlx import mpb, mpb_grpc
from tandem.worker.tokenizer_files import tokenizer_chunks

pytestmark = pytest.mark.timeout(30)
MODEL_PATH = "/models/tiny-qwen3-vl"
ANSWER = "Hello there"


@dataclass
class MlxLike(mpb_grpc.MlxEngineServicer):
    """Answers ``ids`` (then ``eos``, unless cut by ``max_tokens``) as MLX's servicer does;
    records what it was sent."""

    ids: list[int]
    eos: int
    requests: list[mpb.GenerateRequest] = field(default_factory=list)
    aborts: list[list[str]] = field(default_factory=list)
    end_early: bool = False  # end the stream without a complete, as on an Abort
    pause_s: float = 0.0
    healthy: bool = True

    async def Generate(self, request: mpb.GenerateRequest, context: Any):
        self.requests.append(request)
        params = request.sampling_params
        tokens = [*self.ids, self.eos]
        if params.HasField("max_tokens"):
            tokens = tokens[: params.max_tokens]
        reason = "stop" if tokens[-1] == self.eos else "length"
        top = params.logprobs if params.HasField("logprobs") else 0
        collected: list[int] = []
        logprobs = mpb.OutputLogProbs()
        for n, token in enumerate(tokens, 1):
            if self.end_early and n == 2:
                return
            await asyncio.sleep(self.pause_s)
            step = mpb.OutputLogProbs(token_ids=[token], token_logprobs=[-0.5])
            step.top_logprobs.add(
                token_ids=[token + j for j in range(top)], values=[-0.1 * j for j in range(top)]
            )
            collected.append(token)
            logprobs.MergeFrom(step)
            if request.stream:
                chunk = mpb.GenerateStreamChunk(
                    token_ids=[token], prompt_tokens=len(request.tokenized.input_ids)
                )
                chunk.completion_tokens = n
                if top:
                    chunk.output_logprobs.CopyFrom(step)
                yield mpb.GenerateResponse(chunk=chunk)
        done = mpb.GenerateComplete(
            output_ids=[] if request.stream else collected,
            finish_reason=reason,
            prompt_tokens=len(request.tokenized.input_ids),
            completion_tokens=len(collected),
        )
        if reason == "stop":
            done.matched_stop_token_id = self.eos
        if top and not request.stream:
            done.output_logprobs.CopyFrom(logprobs)
        yield mpb.GenerateResponse(complete=done)

    async def Abort(self, request: mpb.AbortRequest, context: Any) -> mpb.AbortResponse:
        self.aborts.append(list(request.request_ids))
        return mpb.AbortResponse()

    async def HealthCheck(self, request: Any, context: Any) -> mpb.HealthCheckResponse:
        return mpb.HealthCheckResponse(healthy=self.healthy, message="OK")

    async def GetModelInfo(self, request: Any, context: Any) -> mpb.GetModelInfoResponse:
        return mpb.GetModelInfoResponse(
            model_path=MODEL_PATH,
            served_model_name=MODEL_PATH,
            is_generation=True,
            max_context_length=0,
            eos_token_ids=[self.eos],
            model_type="qwen3",
        )

    async def GetServerInfo(self, request: Any, context: Any) -> mpb.GetServerInfoResponse:
        return mpb.GetServerInfoResponse(
            server_type="mlx-grpc", active_requests=2, uptime_seconds=1.5
        )

    async def GetTokenizer(self, request: Any, context: Any):
        for chunk in tokenizer_chunks(b"zip bytes"):
            yield chunk


@pytest.fixture(scope="module")
def handle(request: pytest.FixtureRequest) -> ModelHandle:
    return ModelHandle.from_dir(request.getfixturevalue("qwen_meta_dir"), "tiny-qwen3-vl")


@pytest.fixture
async def served(handle: ModelHandle) -> AsyncIterator[tuple[MlxLike, MlxClient]]:
    servicer = MlxLike(handle.encode(ANSWER), handle.info.eos_token_ids[0])
    server = grpc.aio.server()
    mpb_grpc.add_MlxEngineServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    client = MlxClient(f"127.0.0.1:{port}")
    try:
        yield servicer, client
    finally:
        await client.close()
        await server.stop(0)


def context(handle: ModelHandle, **fields: Any) -> RequestContext:
    body = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "Hi"}], **fields}
    )
    ctx = RequestContext("chat", "req-7", body.generation(), handle)
    build_prompt(ctx)
    MlxBackend().build_request(ctx)
    return ctx


async def collected(client: MlxClient, ctx: RequestContext) -> Collector:
    collector = Collector(ctx)
    leg: MlxLeg = ctx.wire
    async for frame in client.generate(leg, timeout=10):
        collector.apply(frame)
    return collector


@pytest.mark.parametrize("stream", [True, False])
async def test_the_collected_answer_is_whole_streamed_or_not(served, handle, stream) -> None:
    servicer, client = served
    ctx = context(handle, stream=stream, logprobs=True, top_logprobs=2)
    answer = await collected(client, ctx)
    [choice] = answer.choices
    assert ("".join(choice.text), choice.finish_reason) == (ANSWER, "stop")
    expected_tokens = len(servicer.ids) + 1  # the EOS the servicer leaves in the ids
    usage = answer.usage()
    assert (usage.prompt_tokens, usage.completion_tokens) == (len(ctx.prompt_ids), expected_tokens)
    assert [e.token_id for e in choice.logprobs] == [*servicer.ids, servicer.eos]
    assert all(len(e.top) == 2 and e.logprob == -0.5 for e in choice.logprobs)
    assert servicer.requests[0].stream is stream


async def test_a_length_cut_and_logprobs_without_alternatives(served, handle) -> None:
    servicer, client = served
    ctx = context(handle, max_tokens=3, logprobs=True)
    answer = await collected(client, ctx)
    [choice] = answer.choices
    assert choice.finish_reason == "length" and answer.usage().completion_tokens == 3
    assert servicer.requests[0].sampling_params.logprobs == 1
    assert [e.top for e in choice.logprobs] == [(), (), ()], "the asked-for 0 alternatives"


async def test_n_2_is_two_requests_merged_by_index(served, handle) -> None:
    servicer, client = served
    ctx = context(handle, n=2, seed=11, stream=True)
    answer = await collected(client, ctx)
    assert ["".join(c.text) for c in answer.choices] == [ANSWER, ANSWER]
    assert sorted(r.request_id for r in servicer.requests) == ["req-7-0", "req-7-1"]
    seeds = {r.request_id: r.sampling_params.seed for r in servicer.requests}
    assert seeds == {"req-7-0": 11, "req-7-1": 12}
    assert servicer.aborts == [], "completed calls are not aborted"


async def test_a_dropped_stream_is_aborted_by_its_ids(served, handle) -> None:
    servicer, client = served
    servicer.pause_s = 0.2
    stream = client.generate(context(handle, n=2, stream=True).wire, timeout=10)
    await anext(stream)
    await stream.aclose()
    for _ in range(50):
        if len(servicer.aborts) == 2:
            break
        await asyncio.sleep(0.02)
    assert sorted(servicer.aborts) == [["req-7-0"], ["req-7-1"]]


async def test_a_stream_that_ends_without_its_complete_fails(served, handle) -> None:
    servicer, client = served
    servicer.end_early = True
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await collected(client, context(handle, stream=True))
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "without completing it" in (info.value.details() or "")


async def test_pixels_are_never_sent(served, handle) -> None:
    _, client = served
    with pytest.raises(ValueError, match="carries no pixels"):
        client.generate(context(handle).wire, pixels=object())  # type: ignore[arg-type]


async def test_the_other_calls(served) -> None:
    servicer, client = served
    description = await client.describe(5.0)
    assert description.model_id == MODEL_PATH, "the id MLX's clients use: its path"
    assert description.labels["supports_vision"] == "false"
    assert "max_context_length" not in description.labels, "0 is an unknown context"
    assert "tandem_worker" not in description.labels
    assert await client.health_check(5.0)
    servicer.healthy = False
    assert not await client.health_check(5.0)
    assert await client.speaks_protocol(5.0), "an unhealthy worker still speaks it"
    assert await client.engine_load() is None
    assert await client.get_tokenizer(5.0) == b"zip bytes"
    await client.abort(["a", "b"])
    assert servicer.aborts == [["a", "b"]], "one Abort names several requests"
    assert await client.release_kv("anything") is False
