"""A scripted stand-in for a TensorRT-LLM worker, on a real loopback gRPC server.

Real TensorRT-LLM engines need CUDA, so these tests cannot run one; this servicer speaks
the real ``trtllm.TrtllmService`` (generated stubs, ``grpc.aio`` on 127.0.0.1) with
canned answers, and records every request and every method called, so a test reads
exactly what the gateway sent and how it reads each answer. Tandem's own worker over this
protocol is tested against the gateway in tests/integration/test_gateway_trtllm.py.

(A unique module name: test directories have no packages.)
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from smg_grpc_proto.generated import common_pb2 as common

from tandem.wire.trtllm import GET_SERVER_INFO_METHOD, trpb, trpb_grpc
from tandem.worker.marker import TandemMarker

TOKENIZER_ZIP = bytes(range(256)) * 30  # opaque stand-in for a zip archive


def top_logprob(sequence: int, position: int) -> float:
    """The made-up logprob the stand-in answers for a token."""
    return -0.125 * (position + 1) - 0.5 * sequence


@dataclass
class StandinState:
    """What the stand-in answers, and what it saw. Tests change it freely."""

    status: str = "OK"
    model_info: trpb.GetModelInfoResponse = field(
        default_factory=lambda: trpb.GetModelInfoResponse(
            model_id="tiny-qwen3-vl",
            max_input_len=4000,
            max_seq_len=4096,
            vocab_size=512,
            supported_features=["guided_decoding", "logprobs", "vision"],
        )
    )
    server_info: trpb.GetServerInfoResponse = field(
        default_factory=lambda: trpb.GetServerInfoResponse(
            version="1.0.0",
            backend="pytorch",
            tensor_parallel_size=2,
            pipeline_parallel_size=1,
            context_parallel_size=1,
            world_size=2,
        )
    )
    # The tokens of each sequence (sequence i answers answers[i % len]).
    answers: list[list[int]] = field(default_factory=lambda: [[11, 12, 13]])
    finish_reasons: list[str] = field(default_factory=lambda: ["stop"])
    prompt_tokens: int = 5
    cached_tokens: int = 0
    hang_after_first: bool = False  # stream one chunk, then wait to be cancelled
    fail_generates: int = 0  # this many Generate calls fail UNAVAILABLE before any answer
    requests: list[trpb.GenerateRequest] = field(default_factory=list)
    aborts: list[str] = field(default_factory=list)
    methods: list[str] = field(default_factory=list)  # every call's full name, any service
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)


def _logprobs(
    tokens: list[int], sequence: int, start: int, alternatives: int | None
) -> list[trpb.TokenLogprob]:
    out = []
    for offset, token in enumerate(tokens):
        value = top_logprob(sequence, start + offset)
        entry = trpb.TokenLogprob(token_id=token, logprob=value)
        if alternatives:
            tops = [(token, value), *((40 + k, -6.0 - k) for k in range(alternatives - 1))]
            entry.top_logprobs.extend(trpb.TopLogprob(token_id=t, logprob=v) for t, v in tops)
        out.append(entry)
    return out


class Standin(trpb_grpc.TrtllmServiceServicer):
    def __init__(self, state: StandinState) -> None:
        self.state = state

    async def HealthCheck(self, request: Any, context: Any) -> trpb.HealthCheckResponse:
        return trpb.HealthCheckResponse(status=self.state.status)

    async def GetModelInfo(self, request: Any, context: Any) -> trpb.GetModelInfoResponse:
        return self.state.model_info

    async def GetServerInfo(self, request: Any, context: Any) -> trpb.GetServerInfoResponse:
        return self.state.server_info

    async def GetTokenizer(self, request: Any, context: Any) -> AsyncIterator[Any]:
        half = len(TOKENIZER_ZIP) // 2
        yield common.GetTokenizerChunk(data=TOKENIZER_ZIP[:half])
        digest = hashlib.sha256(TOKENIZER_ZIP).hexdigest()
        yield common.GetTokenizerChunk(data=TOKENIZER_ZIP[half:], sha256=digest)

    async def Abort(self, request: trpb.AbortRequest, context: Any) -> trpb.AbortResponse:
        self.state.aborts.append(request.request_id)
        return trpb.AbortResponse(success=True)

    async def Generate(
        self, request: trpb.GenerateRequest, context: Any
    ) -> AsyncIterator[trpb.GenerateResponse]:
        state = self.state
        state.requests.append(request)
        if state.fail_generates > 0:
            state.fail_generates -= 1
            await context.abort(grpc.StatusCode.UNAVAILABLE, "stand-in: failing as asked")
        n = max(1, request.sampling_config.num_return_sequences)
        seqs = [list(state.answers[i % len(state.answers)]) for i in range(n)]
        wants = request.output_config.HasField("logprobs")
        k = request.output_config.logprobs if wants else None
        rid = request.request_id
        if request.streaming:
            # Interleaved, one token per chunk: the reader must route by sequence_index.
            for position in range(max(len(s) for s in seqs)):
                for i, seq in enumerate(seqs):
                    if position >= len(seq):
                        continue
                    chunk = trpb.GenerateStreamChunk(
                        token_ids=[seq[position]],
                        sequence_index=i,
                        prompt_tokens=state.prompt_tokens,
                        completion_tokens=position + 1,
                    )
                    if wants:
                        chunk.logprobs.extend(_logprobs([seq[position]], i, position, k))
                    yield trpb.GenerateResponse(request_id=rid, chunk=chunk)
                    if state.hang_after_first:
                        try:
                            await asyncio.sleep(3600)
                        finally:
                            state.cancelled.set()
        for i, seq in enumerate(seqs):
            done = trpb.GenerateComplete(
                output_token_ids=seq,
                sequence_index=i,
                finish_reason=state.finish_reasons[i % len(state.finish_reasons)],
                prompt_tokens=state.prompt_tokens,
                completion_tokens=len(seq),
                cached_tokens=state.cached_tokens,
            )
            if wants and not request.streaming:
                done.logprobs.extend(_logprobs(seq, i, 0, k))
            yield trpb.GenerateResponse(request_id=rid, complete=done)


class _Recorder(grpc.aio.ServerInterceptor):
    """Records the full name of every call, also of methods no service here serves."""

    def __init__(self, state: StandinState) -> None:
        self.state = state

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        self.state.methods.append(details.method)
        return await continuation(details)


class StandinServer:
    """The stand-in on 127.0.0.1 (``tandem``: with the Tandem worker marker)."""

    def __init__(self, state: StandinState, *, tandem: bool = False) -> None:
        self.state = state
        interceptors: list[grpc.aio.ServerInterceptor] = [_Recorder(state)]
        if tandem:
            interceptors.append(TandemMarker(GET_SERVER_INFO_METHOD))
        self._server = grpc.aio.server(interceptors=interceptors)
        trpb_grpc.add_TrtllmServiceServicer_to_server(Standin(state), self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self.url = f"127.0.0.1:{self.port}"

    async def __aenter__(self) -> StandinServer:
        await self._server.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._server.stop(0)


async def eventually(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)
