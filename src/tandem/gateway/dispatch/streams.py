"""Calls to one worker: start a leg, wait for its first frame, relay the rest.

Every dispatcher (aggregated, PD) opens worker streams through these helpers, so a
gRPC failure becomes the same :class:`~tandem.errors.TandemError` everywhere and a
dropped stream always ends its worker call (Abort).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import grpc

from tandem.errors import (
    WORKER_ERROR_CODE_KEY,
    TandemError,
    error_from_grpc,
    make_error,
    transport_failure,
)
from tandem.gateway.backends.frames import Frame
from tandem.gateway.workers.protocol import Leg, WorkerStream
from tandem.gateway.workers.registry import WorkerRegistry
from tandem.gateway.workers.worker import Worker
from tandem.wire.pixels import PixelPayload

log = logging.getLogger("tandem.gateway.dispatch")


class Frames(Protocol):
    """What an opened stream yields: frames, and ``aclose`` to drop what is left."""

    def __aiter__(self) -> AsyncIterator[Frame]: ...

    def __anext__(self) -> Awaitable[Frame]: ...

    async def aclose(self) -> None: ...


@dataclass(slots=True)
class OpenedStream:
    """A worker stream whose first frame has arrived; ``close`` settles the accounting."""

    frames: Frames
    close: Callable[[bool], None]

    async def abandon(self) -> None:
        """Drop the worker call(s) and settle the counts, if nothing else did (idempotent)."""
        try:
            await self.frames.aclose()
        finally:
            self.close(False)


async def worker_pixels(pixels: PixelPayload | None, worker: Worker) -> PixelPayload | None:
    """``pixels`` in the form ``worker`` takes, ready for :func:`send`.

    Normalizing raw pixels for a worker that does not normalize on device costs
    milliseconds per large image (1.3 ms of CPU for 1024² in the gateway, where the
    mapped pages are touched for the first time); numpy releases the GIL meanwhile, so it
    runs in a thread and the event loop keeps relaying other requests' tokens.
    """
    if pixels is None or not pixels.has_raw or worker.device_normalizes:
        return pixels
    return await asyncio.to_thread(pixels.for_worker, False)


def send(
    registry: WorkerRegistry,
    worker: Worker,
    request: Leg,
    timeout_s: float,
    pixels: PixelPayload | None = None,
    *,
    error_code: str = "worker_error",
) -> WorkerStream:
    """Start the call; the request (and ``pixels``) are serialized before this returns.

    The worker protocol's sender puts the pixels in the form and on the transport the
    worker takes (callers with pixels pass them through :func:`worker_pixels` first). A
    worker removed from the registry since it was selected (``DELETE /workers`` between
    two PD legs) fails the leg with ``error_code`` as a 503 charged to no worker.
    """
    try:
        client = registry.client(worker.url)
    except KeyError:
        err = make_error(
            error_code,
            f"worker {worker.url} was removed while the request was in flight",
            status=503,
            retryable=True,
        )
        err.leg = None  # not the worker's fault: no breaker counts it
        raise err from None
    return registry.leg_sender.start(client, worker, request, timeout_s, pixels)


async def first_frame(
    stream: WorkerStream, worker: Worker, error_code: str
) -> tuple[WorkerStream, Frame]:
    """Wait for the worker's first frame; failures come back as TandemError."""
    try:
        first = await anext(stream)
    except grpc.aio.AioRpcError as err:
        raise _from_rpc_error(error_code, err) from None
    except StopAsyncIteration:
        raise make_error(
            error_code, f"worker {worker.url} ended the stream without output"
        ) from None
    return stream, first


async def start_stream(
    registry: WorkerRegistry,
    worker: Worker,
    request: Leg,
    timeout_s: float,
    error_code: str,
) -> tuple[WorkerStream, Frame]:
    """``send`` and ``first_frame`` for a leg that carries no pixel payload."""
    stream = send(registry, worker, request, timeout_s, error_code=error_code)
    return await first_frame(stream, worker, error_code)


class Relay:
    """The frames of one opened worker stream, its first frame included.

    Mid-stream gRPC failures come out as ``error_code``. ``aclose`` drops the worker
    call (Abort, unless it completed) even when iteration never started: an async
    generator that never ran skips its ``finally``, and a stream whose SSE response
    never began must still end its worker call.
    """

    __slots__ = ("_error_code", "_first", "_ready", "_stream")

    def __init__(self, stream: WorkerStream, first: Frame, error_code: str) -> None:
        self._stream = stream
        self._first: Frame | None = first
        self._error_code = error_code
        self._ready: Callable[[], Frame | None] | None = getattr(stream, "ready_frame", None)

    def __aiter__(self) -> Relay:
        return self

    async def __anext__(self) -> Frame:
        first, self._first = self._first, None
        if first is not None:
            return first
        try:
            return await self._stream.__anext__()
        except StopAsyncIteration:
            await self.aclose()
            raise
        except grpc.aio.AioRpcError as err:
            await self.aclose()
            raise _from_rpc_error(self._error_code, err) from None
        except BaseException:
            await self.aclose()
            raise

    async def take_ready(self) -> Frame | None:
        """The next frame if it has arrived already, else None; never waits for the worker
        (a stream that cannot tell gives None). Failures come out as from ``__anext__``."""
        first, self._first = self._first, None
        if first is not None:
            return first
        take = self._ready
        if take is None:
            return None
        try:
            return take()
        except grpc.aio.AioRpcError as err:
            await self.aclose()
            raise _from_rpc_error(self._error_code, err) from None
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        self._first = None
        await self._stream.aclose()


def relay(stream: WorkerStream, first: Frame, error_code: str) -> Relay:
    """Yield the stream's frames (the first one included); map mid-stream failures."""
    return Relay(stream, first, error_code)


def _from_rpc_error(error_code: str, err: grpc.aio.AioRpcError) -> TandemError:
    worker_code = next(
        (str(v) for k, v in err.trailing_metadata() or () if k == WORKER_ERROR_CODE_KEY), None
    )
    if worker_code is None and transport_failure(err.code(), err.details()):
        # The client is told the connection was lost; gRPC's own words stay here.
        log.warning("%s: worker connection lost: %s", error_code, err.details())
    return error_from_grpc(error_code, err.code(), err.details(), worker_code)
