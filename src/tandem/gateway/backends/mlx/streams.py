"""An MLX leg's calls as one :class:`~tandem.gateway.workers.protocol.WorkerStream`.

Two things MLX's answers leave to the gateway:

- An aborted request's stream just ends, with no ``complete`` and an OK status (MLX's
  servicer ends it so on an ``Abort`` or at shutdown). Read as an answer that would be a
  truncated text passed off as whole; :class:`CompletingStream` reports it as the worker
  failure it is (UNAVAILABLE: another worker may serve the request).
- One sample per request: a leg of n samples is n calls (``leg.py``), merged by
  :class:`SampleStreams` with each sample's frames stamped with its index. Dropping it drops
  every call still running (each sends its own ``Abort``); the first failure of any call
  fails the whole leg.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from tandem.gateway.backends.frames import Frame
from tandem.gateway.backends.grpc_client import LegStream
from tandem.gateway.dispatch.streams import OpenedStream
from tandem.gateway.pd.merge import merge


def ended_unfinished(request_id: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE,
        grpc.aio.Metadata(),
        grpc.aio.Metadata(),
        f"the mlx worker ended request {request_id} without completing it (aborted there, "
        "or the worker is shutting down)",
    )


class CompletingStream:
    """One call's frames; a call that ends before its ``complete`` fails (see above)."""

    def __init__(self, inner: LegStream) -> None:
        self.request_id = inner.request_id
        self.started = False
        self._inner = inner
        self._closed = False

    @property
    def completed(self) -> bool:
        return self._inner.completed

    def __aiter__(self) -> CompletingStream:
        return self

    async def __anext__(self) -> Frame:
        try:
            frame = await anext(self._inner)
        except StopAsyncIteration:
            if self._closed or self._inner.completed:
                raise
            raise ended_unfinished(self.request_id) from None
        self.started = True
        return frame

    async def aclose(self) -> None:
        self._closed = True
        await self._inner.aclose()


def _settled(ok: bool) -> None:
    """Nothing to settle per call: the dispatcher settles the leg."""


class SampleStreams:
    """n single-sample calls as one stream; frame ``index`` is the sample's."""

    def __init__(self, request_id: str, streams: Sequence[CompletingStream]) -> None:
        self.request_id = request_id
        self.started = False
        self._streams = list(streams)
        self._merged = merge([OpenedStream(s, _settled) for s in self._streams])

    @property
    def completed(self) -> bool:
        return all(s.completed for s in self._streams)

    def __aiter__(self) -> SampleStreams:
        return self

    async def __anext__(self) -> Frame:
        frame = await anext(self._merged)
        self.started = True
        return frame

    async def aclose(self) -> None:
        await self._merged.aclose()
