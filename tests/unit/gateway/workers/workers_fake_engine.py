"""A protocol-level test double of a vLLM-protocol worker, on a real loopback socket.

It speaks the real ``vllm.grpc.engine.VllmEngine`` service (generated stubs, real
``grpc.aio`` server on 127.0.0.1) but answers with canned data, so the gateway's
client, registry and health checks can be tested fast and deterministically.
The real embedded Tandem worker is tested elsewhere (tests/unit/worker and the
integration tests).

Kept out of conftest.py under a unique module name so that test modules can import
it without importing an ambiguous "conftest".
"""

from __future__ import annotations

import asyncio
import hashlib
import socket
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from tandem.gateway.backends.vllm.client import VllmClient
from tandem.wire.proto import common, pb, pb_grpc

# Reconnect quickly in tests so a restarted worker is seen within a few hundred ms.
FAST_RECONNECT = (
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 100),
)


def make_client(url: str, h2_streams: bool = True) -> VllmClient:
    return VllmClient(url, options=FAST_RECONNECT, abort_timeout_s=2.0, h2_streams=h2_streams)


def free_port() -> int:
    """A loopback port nothing listens on (bound once by us, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


TOKENIZER_ZIP = bytes(range(256)) * 40  # stands in for a zip archive; content is opaque


def default_model_info() -> pb.GetModelInfoResponse:
    return pb.GetModelInfoResponse(
        model_path="/models/tiny-qwen3-vl",
        is_generation=True,
        max_context_length=4096,
        vocab_size=512,
        supports_vision=False,
        served_model_name="",
        architectures=["Qwen3VLForConditionalGeneration"],
        eos_token_ids=[2, 3],
    )


def default_server_info() -> pb.GetServerInfoResponse:
    return pb.GetServerInfoResponse(
        active_requests=3,
        server_type="vllm-grpc",
        kv_connector="TandemConnector",
        kv_role="kv_producer",
        data_parallel_size=1,
        mm_processor="inprocess",
        mm_media_ref_schemes="http,https,data",
        mm_device_do_normalize=False,
        max_num_seqs=8,
    )


@dataclass
class FakeEngineState:
    """What the double answers, and what it saw. Tests mutate it freely."""

    model_info: pb.GetModelInfoResponse = field(default_factory=default_model_info)
    server_info: pb.GetServerInfoResponse = field(default_factory=default_server_info)
    healthy: bool = True
    tokenizer: bytes = TOKENIZER_ZIP
    tokenizer_sha256: str | None = None  # None: the true digest; "" sends none
    frames_per_sample: int = 3
    frame_delay_s: float = 0.02
    fail_at_start: grpc.StatusCode | None = None
    fail_after_first: grpc.StatusCode | None = None
    aborted: list[str] = field(default_factory=list)
    generate_calls: list[str] = field(default_factory=list)
    generate_requests: list[pb.GenerateRequest] = field(default_factory=list)
    generate_cancelled: list[str] = field(default_factory=list)
    abort_seen: asyncio.Event = field(default_factory=asyncio.Event)


class FakeEngineServicer(pb_grpc.VllmEngineServicer):
    def __init__(self, state: FakeEngineState) -> None:
        self.state = state

    async def Generate(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateResponse]:
        state = self.state
        state.generate_calls.append(request.request_id)
        state.generate_requests.append(request)
        if state.fail_at_start is not None:
            await context.abort(state.fail_at_start, "refused before any output")
        try:
            for index in range(max(1, request.sampling_params.n)):
                for step in range(state.frames_per_sample):
                    await asyncio.sleep(state.frame_delay_s)
                    yield pb.GenerateResponse(
                        chunk=pb.GenerateStreamChunk(token_ids=[10 + step], index=index)
                    )
                    if state.fail_after_first is not None:
                        await context.abort(state.fail_after_first, "engine fell over")
                yield pb.GenerateResponse(
                    complete=pb.GenerateComplete(finish_reason="length", index=index)
                )
        except asyncio.CancelledError:
            state.generate_cancelled.append(request.request_id)
            raise

    async def Abort(self, request: pb.AbortRequest, context: Any) -> pb.AbortResponse:
        self.state.aborted.extend(request.request_ids)
        self.state.abort_seen.set()
        return pb.AbortResponse()

    async def HealthCheck(
        self, request: pb.HealthCheckRequest, context: Any
    ) -> pb.HealthCheckResponse:
        return pb.HealthCheckResponse(healthy=self.state.healthy, message="fake")

    async def GetModelInfo(
        self, request: pb.GetModelInfoRequest, context: Any
    ) -> pb.GetModelInfoResponse:
        return self.state.model_info

    async def GetServerInfo(
        self, request: pb.GetServerInfoRequest, context: Any
    ) -> pb.GetServerInfoResponse:
        return self.state.server_info

    async def GetLoads(self, request: pb.GetLoadsRequest, context: Any) -> pb.GetLoadsResponse:
        return pb.GetLoadsResponse(
            dp_rank_count=1, loads=[pb.SchedulerLoad(num_running_reqs=2, num_waiting_reqs=1)]
        )

    async def GetTokenizer(
        self, request: common.GetTokenizerRequest, context: Any
    ) -> AsyncIterator[common.GetTokenizerChunk]:
        data = self.state.tokenizer
        digest = self.state.tokenizer_sha256
        if digest is None:
            digest = hashlib.sha256(data).hexdigest()
        step = 1000  # several chunks, so the client must concatenate
        offsets = list(range(0, len(data), step)) or [0]
        for i, start in enumerate(offsets):
            last = i == len(offsets) - 1
            yield common.GetTokenizerChunk(
                data=data[start : start + step], sha256=digest if last else ""
            )


class FakeEngineWorker:
    """A grpc.aio server on 127.0.0.1 running :class:`FakeEngineServicer`; restartable."""

    def __init__(
        self,
        state: FakeEngineState | None = None,
        interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    ) -> None:
        self.state = state or FakeEngineState()
        self.interceptors = list(interceptors)
        self.port = 0
        self._server: grpc.aio.Server | None = None

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        """Bind (a fresh port the first time, the same port after a stop) and serve."""
        server = grpc.aio.server(interceptors=self.interceptors)
        pb_grpc.add_VllmEngineServicer_to_server(FakeEngineServicer(self.state), server)
        bound = server.add_insecure_port(f"127.0.0.1:{self.port}")
        if bound == 0:
            raise RuntimeError(f"could not bind 127.0.0.1:{self.port}")
        self.port = bound
        await server.start()
        self._server = server

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=None)
            self._server = None
