"""A typed client for one worker's ``mlx.grpc.engine.MlxEngine`` service.

Abort-on-drop, the channel and the tokenizer check are every protocol's
(``backends/grpc_client.py``); this adds MLX's messages: ``GetModelInfo`` and
``GetServerInfo`` (with the Tandem marker) read into labels, ``HealthCheck``, an ``Abort``
naming several requests at once, and ``Generate`` as one call per sample (``streams.py``).
The protocol has no ``GetLoads`` (the engine's queue is unknown: ``engine_load`` answers
None without a call) and no KV handoff (``release_kv`` has nothing to release).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from smg_grpc_proto.generated import common_pb2 as common

from tandem.gateway.backends.grpc_client import GrpcWorkerClient
from tandem.gateway.backends.mlx.frames import mlx_frame
from tandem.gateway.backends.mlx.labels import model_id_of, worker_labels
from tandem.gateway.backends.mlx.leg import MlxLeg
from tandem.gateway.backends.mlx.streams import CompletingStream, SampleStreams
from tandem.gateway.workers.protocol import WorkerDescription, WorkerStream
from tandem.gateway.workers.worker import EngineLoad
from tandem.wire.mlx import mpb, mpb_grpc
from tandem.wire.pixels import PixelPayload


class MlxClient(GrpcWorkerClient):
    """One gRPC channel to one MLX-protocol worker ("host:port"); a
    :class:`~tandem.gateway.workers.protocol.WorkerClient`."""

    def __init__(
        self,
        url: str,
        *,
        options: Sequence[tuple[str, Any]] = (),
        abort_timeout_s: float = 5.0,
    ) -> None:
        super().__init__(url, options=options, abort_timeout_s=abort_timeout_s)
        self._stub = mpb_grpc.MlxEngineStub(self._channel)

    async def describe(self, timeout: float) -> WorkerDescription:
        """The model and labels; ValueError when the worker names no model."""
        return WorkerDescription(
            *await self.read_description(
                self._stub.GetModelInfo(
                    mpb.GetModelInfoRequest(), timeout=timeout, wait_for_ready=True
                ),
                self._stub.GetServerInfo(
                    mpb.GetServerInfoRequest(), timeout=timeout, wait_for_ready=True
                ),
                model_id_of,
                worker_labels,
            )
        )

    async def speaks_protocol(self, timeout: float) -> bool:
        """Whether the worker serves this protocol (waits up to ``timeout`` for it to come up)."""
        request = mpb.HealthCheckRequest()
        return await self.answers(
            self._stub.HealthCheck(request, timeout=timeout, wait_for_ready=True)
        )

    async def health_check(self, timeout: float = 2.0) -> bool:
        """True iff the worker answered in time and said it is healthy."""
        request = mpb.HealthCheckRequest()
        return await self.answered_healthy(self._stub.HealthCheck(request, timeout=timeout))

    async def engine_load(self, timeout: float = 2.0) -> EngineLoad | None:
        return None  # MLX has no GetLoads: nothing is asked

    async def get_tokenizer(self, timeout: float | None = None) -> bytes:
        """The worker's tokenizer archive (zip bytes), checked against its sha256."""
        call = self._stub.GetTokenizer(common.GetTokenizerRequest(), timeout=timeout)
        return await self.read_tokenizer(call)

    async def abort(self, request_ids: Sequence[str], timeout: float | None = None) -> None:
        await self._stub.Abort(
            mpb.AbortRequest(request_ids=list(request_ids)),
            timeout=self.abort_timeout_s if timeout is None else timeout,
        )

    async def release_kv(self, transfer_id: str, timeout: float = 2.0) -> bool:
        return False  # no PD over MLX: a worker holds no KV for a gateway

    def generate(
        self,
        leg: MlxLeg,
        timeout: float | None = None,
        pixels: PixelPayload | None = None,
        on_done: Callable[[], None] | None = None,
    ) -> WorkerStream:
        """Start ``Generate`` for each sample; errors (even "could not connect") surface
        while iterating. ``on_done`` runs once every call has ended."""
        if pixels is not None:
            raise ValueError("the mlx worker protocol carries no pixels")
        requests = leg.samples()
        done = _once_all_ended(len(requests), on_done)
        read = partial(mlx_frame, alternatives=leg.alternatives)
        streams = [
            CompletingStream(
                self.leg_stream(
                    self._stub.Generate(request, timeout=timeout),
                    request.request_id,
                    1,
                    read,
                    done,
                )
            )
            for request in requests
        ]
        if len(streams) == 1:
            return streams[0]
        return SampleStreams(leg.request_id, streams)


def _once_all_ended(calls: int, on_done: Callable[[], None] | None) -> Callable[[], None] | None:
    """``on_done`` run when the last of ``calls`` ends."""
    if on_done is None:
        return None
    left = [calls]

    def ended() -> None:
        left[0] -= 1
        if left[0] == 0:
            on_done()

    return ended
