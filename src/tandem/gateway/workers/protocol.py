"""What the gateway asks of a worker, whatever protocol it speaks (the low half of the seam).

Each protocol's folder (``gateway/backends/``) gives a :class:`WorkerClient` per worker and
a :class:`LegSender` that starts a leg on it; the registry, the health checker and the
dispatch helpers use only these. The request-level half (building legs, media, PD pairing)
is :class:`tandem.gateway.backend.Backend`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias

from tandem.gateway.backends.frames import Frame
from tandem.gateway.workers.worker import EngineLoad, Worker
from tandem.wire.pixels import PixelPayload

# One protocol's request message for one leg. Only that protocol's folder reads or writes
# it; everywhere else it is carried as it is.
Leg: TypeAlias = Any


@dataclass(frozen=True, slots=True)
class WorkerDescription:
    """What a worker says about itself: the model it serves and its capability labels
    (``gateway/workers/worker.py`` reads them)."""

    model_id: str
    labels: dict[str, str]


class WorkerStream(Protocol):
    """One leg's frames as they arrive. Dropping it before every choice completed aborts
    the call on the worker (and ``aclose`` does so explicitly)."""

    request_id: str
    started: bool  # a first frame arrived: later errors are stream errors

    @property
    def completed(self) -> bool: ...

    def __aiter__(self) -> WorkerStream: ...

    async def __anext__(self) -> Frame: ...

    async def aclose(self) -> None: ...


class WorkerClient(Protocol):
    """One channel to one worker. gRPC failures surface as ``grpc.aio.AioRpcError``."""

    url: str

    async def describe(self, timeout: float) -> WorkerDescription:
        """The worker's model and labels; waits up to ``timeout`` for it to come up."""
        ...

    async def health_check(self, timeout: float = 2.0) -> bool: ...

    async def engine_load(self, timeout: float = 2.0) -> EngineLoad | None:
        """The engine's queue from its ``GetLoads`` (None: it reports none)."""
        ...

    async def get_tokenizer(self, timeout: float | None = None) -> bytes:
        """The worker's tokenizer archive (zip bytes), checked against its digest."""
        ...

    async def abort(self, request_ids: Sequence[str], timeout: float | None = None) -> None: ...

    def generate(
        self,
        leg: Leg,
        timeout: float | None = None,
        pixels: PixelPayload | None = None,
        on_done: Callable[[], None] | None = None,
    ) -> WorkerStream: ...

    async def release_kv(self, transfer_id: str, timeout: float = 2.0) -> bool: ...

    async def close(self, grace: float | None = None) -> None: ...


class LegSender(Protocol):
    """A protocol's way to reach its workers: a client per worker, and a leg started on one
    with its pixels (in the form, and over the transport, that worker takes)."""

    name: str

    def client(self, url: str) -> WorkerClient: ...

    def start(
        self,
        client: WorkerClient,
        worker: Worker,
        leg: Leg,
        timeout_s: float,
        pixels: PixelPayload | None,
    ) -> WorkerStream: ...

    def rename(self, leg: Leg, request_id: str) -> None:
        """Give ``leg`` a new request id (a retry must not meet the failed try's Abort)."""
        ...

    def record_leg(self, role: str, leg: Leg, pixels: PixelPayload | None = None) -> None:
        """Count the bytes a leg sends, by role (the ``tandem_leg_*`` metrics)."""
        ...

    def close(self) -> None:
        """Free what outlives calls (shared-memory segments of calls that never ended)."""
        ...
