"""The frames of n single-sample streams as one stream (a text request's n > 1 fan-out)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from tandem.gateway.backends.frames import Frame
from tandem.gateway.dispatch.streams import OpenedStream


class Merged:
    """Frames of n single-sample streams as one stream, each restamped with its index.

    ``aclose`` closes every sub-stream, also when iteration never started.
    """

    __slots__ = ("_frames", "_opened")

    def __init__(self, opened: list[OpenedStream]) -> None:
        self._opened = opened
        self._frames = _merge(opened)

    def __aiter__(self) -> Merged:
        return self

    async def __anext__(self) -> Frame:
        return await anext(self._frames)

    async def aclose(self) -> None:
        try:
            await self._frames.aclose()
        finally:
            for stream in self._opened:
                await stream.frames.aclose()


def merge(opened: list[OpenedStream]) -> Merged:
    return Merged(opened)


async def _merge(opened: list[OpenedStream]) -> AsyncGenerator[Frame, None]:
    queue: asyncio.Queue[tuple[int, Frame | BaseException | None]] = asyncio.Queue()

    async def pump(index: int, stream: OpenedStream) -> None:
        try:
            async for frame in stream.frames:
                queue.put_nowait((index, frame))
        except BaseException as exc:
            queue.put_nowait((index, exc))
        else:
            queue.put_nowait((index, None))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(opened)]
    remaining = len(tasks)
    try:
        while remaining:
            index, item = await queue.get()
            if item is None:
                remaining -= 1
                continue
            if isinstance(item, BaseException):
                raise item
            item.index = index
            yield item
    finally:
        for task in tasks:
            task.cancel()
        # A pump still inside its stream must finish unwinding before the stream is closed.
        await asyncio.gather(*tasks, return_exceptions=True)
        for stream in opened:
            await stream.frames.aclose()
