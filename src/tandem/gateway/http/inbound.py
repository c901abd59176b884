"""The HTTP side of a generation request, as the pipeline sees it (``pipeline.run.Inbound``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import ClientDisconnect, Request

from tandem.ascii_int import ascii_int
from tandem.errors import make_error
from tandem.gateway.http.access_control import tenant_of
from tandem.gateway.pipeline.run import ClientGone

T = TypeVar("T")


class HttpInbound:
    def __init__(self, request: Request) -> None:
        self.request = request

    @property
    def tenant(self) -> str | None:
        return tenant_of(self.request)

    @property
    def declared_length(self) -> int | None:
        return ascii_int(self.request.headers.get("content-length"))

    async def read_body(self, limit: int) -> bytes:
        """The request body, refused with 413 as soon as it passes ``limit`` bytes."""
        chunks, size = [], 0
        try:
            async for chunk in self.request.stream():
                size += len(chunk)
                if size > limit:
                    raise make_error("payload_too_large", f"request body is over {limit} bytes")
                chunks.append(chunk)
        except ClientDisconnect:
            raise ClientGone() from None
        return b"".join(chunks)

    async def until_disconnect(self, work: Awaitable[T]) -> T:
        """Run ``work``; cancel it (and so abort the worker call) if the client goes away.

        The client leaving surfaces as :class:`ClientGone`, which the pipeline answers
        (for the log and metrics) with 499; a bare CancelledError would reach the server
        as an application failure.
        """
        task = asyncio.ensure_future(work)
        gone = False

        async def watch() -> None:
            nonlocal gone
            while True:
                message = await self.request.receive()
                if message["type"] == "http.disconnect":
                    gone = True
                    task.cancel()
                    return

        watcher = asyncio.ensure_future(watch())
        try:
            return await task
        except asyncio.CancelledError:
            if gone and task.cancelled():
                raise ClientGone() from None
            raise
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
