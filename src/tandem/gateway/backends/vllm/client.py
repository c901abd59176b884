"""A typed client for one worker's ``vllm.grpc.engine.VllmEngine`` service.

Abort-on-drop, the channel, the tokenizer check and the KV release are every protocol's
(``backends/grpc_client.py``); this adds vLLM's messages: its info calls read into
labels, its ``Abort``, and ``Generate`` with the pixels spliced into the request bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tandem.gateway.backends.grpc_client import GrpcWorkerClient, LegStream
from tandem.gateway.backends.vllm.frames import frame_of
from tandem.gateway.backends.vllm.labels import model_id_of, worker_labels
from tandem.gateway.workers.protocol import WorkerDescription
from tandem.gateway.workers.worker import EngineLoad
from tandem.wire.h2grpc.channel import H2Channel, h2_channel
from tandem.wire.h2grpc.connection import MessageParts
from tandem.wire.pixel_splice import message_parts, serialize_with_pixels
from tandem.wire.pixels import PixelPayload
from tandem.wire.proto import common, pb, pb_grpc

GENERATE = "/vllm.grpc.engine.VllmEngine/Generate"


class VllmClient(GrpcWorkerClient):
    """One gRPC channel to one vLLM-protocol worker ("host:port"); a
    :class:`~tandem.gateway.workers.protocol.WorkerClient`."""

    kv_events_method = "/vllm.grpc.engine.VllmEngine/SubscribeKvEvents"

    def __init__(
        self,
        url: str,
        *,
        options: Sequence[tuple[str, Any]] = (),
        abort_timeout_s: float = 5.0,
        h2_streams: bool = True,
    ) -> None:
        super().__init__(url, options=options, abort_timeout_s=abort_timeout_s)
        self._stub = pb_grpc.VllmEngineStub(self._channel)
        # Generate with a request the caller serialized itself (pixels outside the message).
        self._generate_raw = self._channel.unary_stream(
            GENERATE, request_serializer=bytes, response_deserializer=pb.GenerateResponse.FromString
        )
        # --worker-stream-client h2: Generate over Tandem's HTTP/2 client (tandem/wire/h2grpc);
        # every other call stays on the grpc.aio channel.
        self._h2: H2Channel | None = h2_channel(url) if h2_streams else None
        self._h2_generate = (
            self._h2.unary_stream(GENERATE, _serialized, pb.GenerateResponse.FromString)
            if self._h2 is not None
            else None
        )

    async def describe(self, timeout: float) -> WorkerDescription:
        """``GetModelInfo`` and ``GetServerInfo`` (with the Tandem marker) read into labels;
        ValueError when the worker names no model."""
        return WorkerDescription(
            *await self.read_description(
                self.get_model_info(timeout=timeout, wait_for_ready=True),
                self._stub.GetServerInfo(
                    pb.GetServerInfoRequest(), timeout=timeout, wait_for_ready=True
                ),
                model_id_of,
                worker_labels,
            )
        )

    async def get_model_info(
        self, timeout: float | None = None, wait_for_ready: bool = False
    ) -> pb.GetModelInfoResponse:
        return await self._stub.GetModelInfo(
            pb.GetModelInfoRequest(), timeout=timeout, wait_for_ready=wait_for_ready
        )

    async def get_server_info(
        self, timeout: float | None = None, wait_for_ready: bool = False
    ) -> pb.GetServerInfoResponse:
        return await self._stub.GetServerInfo(
            pb.GetServerInfoRequest(), timeout=timeout, wait_for_ready=wait_for_ready
        )

    async def speaks_protocol(self, timeout: float) -> bool:
        """Whether the worker serves this protocol (waits up to ``timeout`` for it to come up)."""
        return await self.answers(
            self._stub.HealthCheck(pb.HealthCheckRequest(), timeout=timeout, wait_for_ready=True)
        )

    async def health_check(self, timeout: float = 2.0) -> bool:
        """True iff the worker answered in time and said it is healthy."""
        return await self.answered_healthy(
            self._stub.HealthCheck(pb.HealthCheckRequest(), timeout=timeout)
        )

    async def get_loads(
        self, timeout: float | None = None, dp_rank: int | None = None
    ) -> pb.GetLoadsResponse:
        request = pb.GetLoadsRequest()
        if dp_rank is not None:
            request.dp_rank = dp_rank
        return await self._stub.GetLoads(request, timeout=timeout)

    async def engine_load(self, timeout: float = 2.0) -> EngineLoad | None:
        counts = await self.read_load(self._stub.GetLoads(pb.GetLoadsRequest(), timeout=timeout))
        return EngineLoad(*counts) if counts is not None else None

    async def get_tokenizer(self, timeout: float | None = None) -> bytes:
        """The worker's tokenizer archive (zip bytes), checked against its sha256."""
        call = self._stub.GetTokenizer(common.GetTokenizerRequest(), timeout=timeout)
        return await self.read_tokenizer(call)

    async def abort(self, request_ids: Sequence[str], timeout: float | None = None) -> None:
        await self._stub.Abort(
            pb.AbortRequest(request_ids=list(request_ids)),
            timeout=self.abort_timeout_s if timeout is None else timeout,
        )

    def generate(
        self,
        request: pb.GenerateRequest,
        timeout: float | None = None,
        pixels: PixelPayload | None = None,
        on_done: Callable[[], None] | None = None,
    ) -> LegStream:
        """Start ``Generate``; errors (even "could not connect") surface while iterating.

        ``pixels`` (kept outside the message) go out from their own array over the h2
        client, or serialized once into the outgoing bytes over grpc.aio; either way the
        caller may drop its reference as soon as this returns. ``on_done`` runs
        when the call ends, however it ends (the leg's shared-memory segments go then).
        """
        call: Any
        if self._h2_generate is not None:
            # The pixels go from their array to the socket (no copy of them is made).
            message = request if pixels is None else message_parts(request, pixels)
            call = self._h2_generate(message, timeout=timeout)
        elif pixels is None:
            call = self._stub.Generate(request, timeout=timeout)
        else:
            call = self._generate_raw(serialize_with_pixels(request, pixels), timeout=timeout)
        n = max(1, request.sampling_params.n)
        return self.leg_stream(call, request.request_id, n, frame_of, on_done)

    async def close(self, grace: float | None = None) -> None:
        await super().close(grace)
        if self._h2 is not None:
            await self._h2.close()


def _serialized(request: pb.GenerateRequest | MessageParts) -> bytes | MessageParts:
    return request if isinstance(request, tuple) else request.SerializeToString()
