"""``SseResponse`` driven as an ASGI app: what it sends, and how it ends when the client
leaves, when it is cancelled from outside, and under a server of ASGI spec 2.4.

The ASGI ``receive``/``send`` pair is a small in-test stand-in for the server, because
these tests must choose when the client leaves; real uvicorn streams (and a real client
leaving one) are covered by ``tests/integration/test_pd_gateway.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tandem.gateway.http.sse import DONE, sse_response


class Server:
    """Records what the app sends; ``leave()`` makes ``receive`` answer http.disconnect."""

    def __init__(self, spec: str = "2.3", leave_at_end: bool = False) -> None:
        self.scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": spec}}
        self.sent: list[dict[str, Any]] = []
        self._left = asyncio.Event()
        self._leave_at_end = leave_at_end

    def leave(self) -> None:
        self._left.set()

    async def receive(self) -> dict[str, Any]:
        await self._left.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)
        if self._leave_at_end and message.get("more_body") is False:
            self.leave()  # uvicorn answers receive() with http.disconnect once complete
        await asyncio.sleep(0)  # lets the listener run before send returns

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent[1:])


async def endless(closed: list[str], first: asyncio.Event | None = None) -> AsyncIterator[Any]:
    try:
        yield {"i": 0}
        if first is not None:
            first.set()
        while True:
            await asyncio.sleep(0.01)
            yield {"i": 1}
    finally:
        closed.append("closed")


async def few(closed: list[str] | None = None) -> AsyncIterator[Any]:
    try:
        yield {"i": 0}
        yield b"data: framed\n\n"
    finally:
        if closed is not None:
            closed.append("closed")


async def test_the_body_ends_in_the_write_that_carries_done() -> None:
    server = Server()
    await sse_response(few())(server.scope, server.receive, server.send)
    assert server.sent[0]["type"] == "http.response.start"
    assert (b"content-type", b"text/event-stream") in server.sent[0]["headers"]
    last = server.sent[-1]
    assert last["body"] == DONE and last["more_body"] is False
    assert all(m["more_body"] for m in server.sent[1:-1])
    assert server.body == b'data: {"i":0}\n\ndata: framed\n\n' + DONE


async def test_a_client_leaving_mid_stream_ends_the_response_quietly_and_closes_events() -> None:
    server, closed, first = Server(), [], asyncio.Event()
    app = sse_response(endless(closed, first))
    call = asyncio.ensure_future(app(server.scope, server.receive, server.send))
    await first.wait()
    server.leave()
    await asyncio.wait_for(call, 5)  # returns, no CancelledError: the client simply left
    assert closed == ["closed"]
    assert DONE not in server.body


async def test_a_cancellation_from_outside_still_propagates() -> None:
    server, closed, first = Server(), [], asyncio.Event()
    call = asyncio.ensure_future(
        sse_response(endless(closed, first))(server.scope, server.receive, server.send)
    )
    await first.wait()
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert closed == ["closed"]


async def test_the_disconnect_that_follows_a_complete_body_cancels_nothing() -> None:
    server, closed = Server(leave_at_end=True), []
    await sse_response(few(closed))(server.scope, server.receive, server.send)
    assert closed == ["closed"]  # the events were closed by the response, not cut short
    await asyncio.sleep(0.01)  # were the task cancelled, this sleep would raise
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
    assert server.body.endswith(DONE)


async def test_under_spec_2_4_the_body_streams_without_a_listener() -> None:
    server = Server("2.4")
    await sse_response(few())(server.scope, server.receive, server.send)
    assert server.body.endswith(DONE)
    assert server.sent[-1]["more_body"] is False
