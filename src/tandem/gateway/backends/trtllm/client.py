"""A typed client for one worker's ``trtllm.TrtllmService``.

Abort-on-drop, the channel, the tokenizer check and the marker are every protocol's
(``backends/grpc_client.py``); this adds TensorRT-LLM's calls. ``HealthCheck`` answers a
status string: healthy iff it reads "OK" (trimmed, any case: ``wire.trtllm``), and any
answer at all identifies the protocol. ``Abort`` names one request, so one call per id.
The service has no ``GetLoads``: the engine's load is unknown (None) and never asked
for. ``Generate`` answers ``num_return_sequences`` completes (``frames.py``); its legs
carry no pixel tensors (the images travel as their source bytes, in the message).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

import grpc
from smg_grpc_proto.generated import common_pb2 as common

from tandem.gateway.backends.grpc_client import GrpcWorkerClient, LegStream
from tandem.gateway.backends.trtllm.frames import trtllm_frame
from tandem.gateway.backends.trtllm.labels import model_id_of, worker_labels
from tandem.gateway.workers.protocol import WorkerDescription
from tandem.gateway.workers.worker import EngineLoad
from tandem.wire.pixels import PixelPayload
from tandem.wire.trtllm import status_is_healthy, trpb, trpb_grpc

log = logging.getLogger("tandem.gateway.workers")


class TrtllmClient(GrpcWorkerClient):
    """One gRPC channel to one TensorRT-LLM-protocol worker ("host:port"); a
    :class:`~tandem.gateway.workers.protocol.WorkerClient`."""

    kv_events_method = "/trtllm.TrtllmService/SubscribeKvEvents"

    def __init__(
        self,
        url: str,
        *,
        options: Sequence[tuple[str, Any]] = (),
        abort_timeout_s: float = 5.0,
    ) -> None:
        super().__init__(url, options=options, abort_timeout_s=abort_timeout_s)
        self._stub = trpb_grpc.TrtllmServiceStub(self._channel)

    async def describe(self, timeout: float) -> WorkerDescription:
        """``GetModelInfo`` and ``GetServerInfo`` (with the Tandem marker) read into labels;
        ValueError when the worker names no model."""
        return WorkerDescription(
            *await self.read_description(
                self._stub.GetModelInfo(
                    trpb.GetModelInfoRequest(), timeout=timeout, wait_for_ready=True
                ),
                self._stub.GetServerInfo(
                    trpb.GetServerInfoRequest(), timeout=timeout, wait_for_ready=True
                ),
                model_id_of,
                worker_labels,
                missing="reported no model_id",
            )
        )

    async def speaks_protocol(self, timeout: float) -> bool:
        """Whether the worker serves this protocol (waits up to ``timeout`` for it to come
        up); a status that is not "OK" still names the protocol."""
        return await self.answers(
            self._stub.HealthCheck(trpb.HealthCheckRequest(), timeout=timeout, wait_for_ready=True)
        )

    async def health_check(self, timeout: float = 2.0) -> bool:
        """True iff the worker answered in time with a healthy status."""
        try:
            reply = await self._stub.HealthCheck(trpb.HealthCheckRequest(), timeout=timeout)
        except grpc.aio.AioRpcError as err:
            log.debug("health check of %s failed: %s", self.url, err.code().name)
            return False
        healthy = status_is_healthy(reply.status)
        if not healthy:
            log.debug("health check of %s: status %r", self.url, reply.status[:200])
        return healthy

    async def engine_load(self, timeout: float = 2.0) -> EngineLoad | None:
        return None  # the service has no GetLoads: no load, not zero load

    async def get_tokenizer(self, timeout: float | None = None) -> bytes:
        """The worker's tokenizer archive (zip bytes), checked against its sha256."""
        call = self._stub.GetTokenizer(common.GetTokenizerRequest(), timeout=timeout)
        return await self.read_tokenizer(call)

    async def abort(self, request_ids: Sequence[str], timeout: float | None = None) -> None:
        wait = self.abort_timeout_s if timeout is None else timeout
        replies = await asyncio.gather(
            *(
                self._stub.Abort(trpb.AbortRequest(request_id=rid), timeout=wait)
                for rid in request_ids
            )
        )
        for rid, reply in zip(request_ids, replies, strict=True):
            if not reply.success:  # already finished, or never known: nothing left to free
                log.debug("abort of %s on %s: %s", rid, self.url, reply.message or "not found")

    def generate(
        self,
        request: trpb.GenerateRequest,
        timeout: float | None = None,
        pixels: PixelPayload | None = None,
        on_done: Callable[[], None] | None = None,
    ) -> LegStream:
        """Start ``Generate``; errors (even "could not connect") surface while iterating."""
        if pixels is not None:
            raise ValueError("the trtllm worker protocol carries no pixel tensors")
        call = self._stub.Generate(request, timeout=timeout)
        n = max(1, request.sampling_config.num_return_sequences)
        return self.leg_stream(call, request.request_id, n, trtllm_frame, on_done)
