"""A stream whose client leaves before its first SSE event still ends its worker call and
settles the worker's in-flight count (the count skews least_load, power_of_two and
cache_aware routing if it leaks).

The app is the real one in-process; the worker side is the scripted dispatcher of
``gateway_app_fakes``, and the ASGI server is played by hand so that the client can
leave at an exact moment: after the dispatch, before the body's first byte.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from gateway_app_fakes import ScriptedDispatcher, chat_body, make_gateway

from tandem.gateway.app import build_app
from tandem.gateway.backends.frames import Frame
from tandem.gateway.context import RequestContext
from tandem.gateway.dispatch.streams import OpenedStream


class Frames:
    """A stream of worker frames that records whether it was closed."""

    def __init__(self, frames: AsyncIterator[Frame]) -> None:
        self._frames = frames
        self.closed = False

    def __aiter__(self) -> Frames:
        return self

    async def __anext__(self) -> Frame:
        return await anext(self._frames)

    async def aclose(self) -> None:
        self.closed = True


class CountingDispatcher(ScriptedDispatcher):
    """Counts what the real dispatchers count: one in-flight request per opened stream."""

    def __init__(self, base: ScriptedDispatcher) -> None:
        self.__dict__.update(base.__dict__)
        self.in_flight = 0
        self.opened: list[Frames] = []

    async def open(self, ctx: RequestContext) -> OpenedStream:
        opened = await super().open(ctx)
        self.in_flight += 1
        settled = False

        def close(ok: bool) -> None:
            nonlocal settled
            if not settled:
                settled = True
                self.in_flight -= 1

        frames = Frames(opened.frames)  # type: ignore[arg-type]
        self.opened.append(frames)
        return OpenedStream(frames, close)


async def test_stream_dropped_before_its_first_event_settles_the_worker(
    qwen_meta_dir: Path,
) -> None:
    state, scripted = make_gateway(qwen_meta_dir)
    dispatcher = CountingDispatcher(scripted)
    state.dispatcher = dispatcher
    app = build_app(state)

    body = json.dumps(chat_body(stream=True)).encode()
    gone = asyncio.Event()
    received = 0

    async def receive() -> dict[str, Any]:
        nonlocal received
        received += 1
        if received == 1:
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()  # the client stays until the response starts, then leaves
        return {"type": "http.disconnect"}

    sent: list[str] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message["type"])
        if message["type"] == "http.response.start":
            gone.set()
            await asyncio.Event().wait()  # the peer never reads: cancelled by the disconnect

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    await asyncio.wait_for(app(scope, receive, send), 10)

    assert sent == ["http.response.start"]  # not one event reached the client
    assert len(dispatcher.opened) == 1
    assert dispatcher.opened[0].closed  # the worker call was dropped (Abort)
    assert dispatcher.in_flight == 0  # and the worker's count settled
    assert state.admission.running == 0
