"""What the clients of the scheduler-shaped protocols (SGLang, TokenSpeed) share.

Both services have the same calls under the same names — ``GetModelInfo`` and
``GetServerInfo`` read into labels, ``HealthCheck``, ``GetLoads``, ``GetTokenizer``, a one-id
``Abort`` with a reason, ``Generate`` answering scheduler frames (``scheduler/frames.py``) —
in different message classes. A protocol's client (``backends/<name>/client.py``) names its
module of messages, its stub, its labels and how its pixels are spliced; this module
imports neither protocol.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from smg_grpc_proto.generated import common_pb2 as common

from tandem.gateway.backends.grpc_client import GrpcWorkerClient, LegStream
from tandem.gateway.backends.scheduler.frames import scheduler_frame
from tandem.gateway.workers.protocol import WorkerDescription
from tandem.gateway.workers.worker import EngineLoad
from tandem.wire.pixels import PixelPayload

DROP_REASON = "Stream dropped"


class SchedulerClient(GrpcWorkerClient):
    """One gRPC channel to one worker of a scheduler protocol ("host:port"); a
    :class:`~tandem.gateway.workers.protocol.WorkerClient`."""

    messages: ModuleType  # the protocol's generated messages (``*_pb2``)
    generate_method: str  # the full name of its Generate, for the raw-bytes call

    def __init__(self, url: str, stub: Callable[[Any], Any], abort_timeout_s: float) -> None:
        super().__init__(url, abort_timeout_s=abort_timeout_s)
        self._stub = stub(self._channel)
        self._generate_raw = self._channel.unary_stream(
            self.generate_method,
            request_serializer=bytes,
            response_deserializer=self.messages.GenerateResponse.FromString,
        )

    # -- what each protocol says ---------------------------------------------------------

    def labels(self, model_info: Any, server_info: Any, marker: str) -> dict[str, str]:
        raise NotImplementedError

    def model_id(self, model_info: Any) -> str:
        raise NotImplementedError

    def loads_request(self) -> Any:
        return self.messages.GetLoadsRequest()

    def serialize(self, request: Any, pixels: PixelPayload) -> bytes:
        """``request``'s bytes with ``pixels`` spliced in where the protocol carries them."""
        raise NotImplementedError

    # -- the calls -----------------------------------------------------------------------

    async def describe(self, timeout: float) -> WorkerDescription:
        """``GetModelInfo`` and ``GetServerInfo`` (with the Tandem marker) read into labels;
        ValueError when the worker names no model."""
        m = self.messages
        return WorkerDescription(
            *await self.read_description(
                self._stub.GetModelInfo(
                    m.GetModelInfoRequest(), timeout=timeout, wait_for_ready=True
                ),
                self._stub.GetServerInfo(
                    m.GetServerInfoRequest(), timeout=timeout, wait_for_ready=True
                ),
                self.model_id,
                self.labels,
            )
        )

    async def speaks_protocol(self, timeout: float) -> bool:
        """Whether the worker serves this protocol (waits up to ``timeout`` for it to come up)."""
        request = self.messages.HealthCheckRequest()
        return await self.answers(
            self._stub.HealthCheck(request, timeout=timeout, wait_for_ready=True)
        )

    async def health_check(self, timeout: float = 2.0) -> bool:
        """True iff the worker answered in time and said it is healthy."""
        request = self.messages.HealthCheckRequest()
        return await self.answered_healthy(self._stub.HealthCheck(request, timeout=timeout))

    async def get_loads(self, timeout: float | None = None) -> Any:
        return await self._stub.GetLoads(self.loads_request(), timeout=timeout)

    async def engine_load(self, timeout: float = 2.0) -> EngineLoad | None:
        counts = await self.read_load(self.get_loads(timeout))
        return EngineLoad(*counts) if counts is not None else None

    async def get_tokenizer(self, timeout: float | None = None) -> bytes:
        """The worker's tokenizer archive (zip bytes), checked against its sha256."""
        call = self._stub.GetTokenizer(common.GetTokenizerRequest(), timeout=timeout)
        return await self.read_tokenizer(call)

    async def abort(self, request_ids: Sequence[str], timeout: float | None = None) -> None:
        # The Abort names one request (its samples go with it): one call per id, at once.
        wait = self.abort_timeout_s if timeout is None else timeout
        make = self.messages.AbortRequest
        await asyncio.gather(
            *(
                self._stub.Abort(make(request_id=rid, reason=DROP_REASON), timeout=wait)
                for rid in request_ids
            )
        )

    def generate(
        self,
        request: Any,
        timeout: float | None = None,
        pixels: PixelPayload | None = None,
        on_done: Callable[[], None] | None = None,
    ) -> LegStream:
        """Start ``Generate``; errors (even "could not connect") surface while iterating.

        ``pixels`` (kept outside the message) are serialized here, once, into the outgoing
        bytes; the caller may drop its reference as soon as this returns.
        """
        if pixels is None:
            call = self._stub.Generate(request, timeout=timeout)
        else:
            call = self._generate_raw(self.serialize(request, pixels), timeout=timeout)
        n = max(1, request.sampling_params.n)
        return self.leg_stream(call, request.request_id, n, scheduler_frame, on_done)
