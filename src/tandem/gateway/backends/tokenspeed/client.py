"""A typed client for one worker's ``tokenspeed.grpc.scheduler.TokenSpeedScheduler``
(and, on an encode worker, ``tokenspeed.grpc.encoder.TokenSpeedEncoder``).

Abort-on-drop, the channel, the tokenizer check and the KV release are every protocol's
(``backends/grpc_client.py``); this adds TokenSpeed's messages: its info calls read into
labels, ``GetLoads`` (an encode worker answers none), its one-id ``Abort`` with a reason,
``Generate`` and ``Encode`` with each item's pixels spliced into the bytes (``splice.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from smg_grpc_proto.generated import common_pb2 as common

from tandem.gateway.backends.grpc_client import GrpcWorkerClient, LegStream
from tandem.gateway.backends.scheduler_frames import scheduler_frame
from tandem.gateway.backends.tokenspeed.labels import model_id_of, worker_labels
from tandem.gateway.backends.tokenspeed.splice import serialize_with_pixels
from tandem.gateway.workers.protocol import WorkerDescription
from tandem.gateway.workers.worker import EngineLoad
from tandem.wire.pixels import PixelPayload
from tandem.wire.tokenspeed import ENCODER_SERVICE_NAME, GENERATE_METHOD, epb, tpb, tpb_grpc

DROP_REASON = "Stream dropped"
ENCODE_METHOD = f"/{ENCODER_SERVICE_NAME}/Encode"


class TokenSpeedClient(GrpcWorkerClient):
    """One gRPC channel to one TokenSpeed-protocol worker ("host:port"); a
    :class:`~tandem.gateway.workers.protocol.WorkerClient`."""

    def __init__(self, url: str, *, abort_timeout_s: float = 5.0) -> None:
        super().__init__(url, abort_timeout_s=abort_timeout_s)
        self._stub = tpb_grpc.TokenSpeedSchedulerStub(self._channel)
        self._generate_raw = self._channel.unary_stream(
            GENERATE_METHOD,
            request_serializer=bytes,
            response_deserializer=tpb.GenerateResponse.FromString,
        )
        self._encode_raw = self._channel.unary_unary(
            ENCODE_METHOD,
            request_serializer=bytes,
            response_deserializer=epb.EncodeResponse.FromString,
        )

    async def describe(self, timeout: float) -> WorkerDescription:
        """``GetModelInfo`` and ``GetServerInfo`` (with the Tandem marker) read into labels;
        ValueError when the worker names no model."""
        model_info, (server_info, marker) = await asyncio.gather(
            self._stub.GetModelInfo(
                tpb.GetModelInfoRequest(), timeout=timeout, wait_for_ready=True
            ),
            self.with_marker(
                self._stub.GetServerInfo(
                    tpb.GetServerInfoRequest(), timeout=timeout, wait_for_ready=True
                )
            ),
        )
        model_id = model_id_of(model_info)
        if not model_id:
            raise ValueError(f"worker {self.url} reported neither a served model name nor a path")
        return WorkerDescription(model_id, worker_labels(model_info, server_info, marker))

    async def speaks_protocol(self, timeout: float) -> bool:
        """Whether the worker serves this protocol (waits up to ``timeout`` for it to come up)."""
        return await self.answers(
            self._stub.HealthCheck(tpb.HealthCheckRequest(), timeout=timeout, wait_for_ready=True)
        )

    async def health_check(self, timeout: float = 2.0) -> bool:
        """True iff the worker answered in time and said it is healthy."""
        return await self.answered_healthy(
            self._stub.HealthCheck(tpb.HealthCheckRequest(), timeout=timeout)
        )

    async def get_loads(self, timeout: float | None = None) -> tpb.GetLoadsResponse:
        return await self._stub.GetLoads(tpb.GetLoadsRequest(), timeout=timeout)

    async def engine_load(self, timeout: float = 2.0) -> EngineLoad | None:
        counts = await self.read_load(self.get_loads(timeout))
        return EngineLoad(*counts) if counts is not None else None

    async def get_tokenizer(self, timeout: float | None = None) -> bytes:
        """The worker's tokenizer archive (zip bytes), checked against its sha256."""
        call = self._stub.GetTokenizer(common.GetTokenizerRequest(), timeout=timeout)
        return await self.read_tokenizer(call)

    async def abort(self, request_ids: Sequence[str], timeout: float | None = None) -> None:
        # TokenSpeed's Abort names one request (its samples' ids go with it).
        wait = self.abort_timeout_s if timeout is None else timeout
        await asyncio.gather(
            *(
                self._stub.Abort(tpb.AbortRequest(request_id=rid, reason=DROP_REASON), timeout=wait)
                for rid in request_ids
            )
        )

    def generate(
        self,
        request: tpb.GenerateRequest,
        timeout: float | None = None,
        pixels: PixelPayload | None = None,
        on_done: Callable[[], None] | None = None,
    ) -> LegStream:
        """Start ``Generate``; errors (even "could not connect") surface while iterating.

        ``pixels`` (kept outside the message) are serialized here, once, into the items'
        ``encoder_input``; the caller may drop its reference as soon as this returns.
        """
        if pixels is None:
            call = self._stub.Generate(request, timeout=timeout)
        else:
            call = self._generate_raw(serialize_with_pixels(request, pixels), timeout=timeout)
        n = max(1, request.sampling_params.n)
        return self.leg_stream(call, request.request_id, n, scheduler_frame, on_done)

    async def encode(
        self, request: epb.EncodeRequest, pixels: PixelPayload | None, timeout: float
    ) -> epb.EncodeResponse:
        """``Encode`` on an encode worker: one item, its pixels spliced in."""
        response: epb.EncodeResponse = await self._encode_raw(
            serialize_with_pixels(request, pixels), timeout=timeout
        )
        return response
