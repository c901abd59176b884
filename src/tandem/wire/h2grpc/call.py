"""One unary-stream gRPC call over :class:`~tandem.wire.h2grpc.connection.H2Connection`.

It behaves as the part of ``grpc.aio.UnaryStreamCall`` the gateway uses: ``read()`` gives
the next message, ``grpc.aio.EOF`` at a clean end, ``None`` for a message that does not
deserialize, and raises :class:`grpc.aio.AioRpcError` for a failed call (with the trailing
metadata, so a worker's error code is read as before); ``cancel()`` resets the stream and
later reads raise :class:`asyncio.CancelledError`; done callbacks run once, however it
ends. The status mapping follows gRPC's HTTP/2 protocol description.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

import grpc

from tandem.wire.h2grpc import frames as f
from tandem.wire.h2grpc.frames import unpack_u32

log = logging.getLogger("tandem.wire.h2grpc")

_BY_VALUE = {code.value[0]: code for code in grpc.StatusCode}
# HTTP status of a response that is not gRPC → the call's status (gRPC's HTTP mapping)
_HTTP_STATUS = {
    400: grpc.StatusCode.INTERNAL,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.UNIMPLEMENTED,
    429: grpc.StatusCode.UNAVAILABLE,
    502: grpc.StatusCode.UNAVAILABLE,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.UNAVAILABLE,
}
# RST_STREAM error code → status
_RESET_STATUS = {
    f.REFUSED_STREAM: grpc.StatusCode.UNAVAILABLE,
    f.CANCEL: grpc.StatusCode.CANCELLED,
    f.ENHANCE_YOUR_CALM: grpc.StatusCode.RESOURCE_EXHAUSTED,
    f.INADEQUATE_SECURITY: grpc.StatusCode.PERMISSION_DENIED,
}
_NO_METADATA = grpc.aio.Metadata()
NOT_READY = object()  # what read_ready() gives while no message has arrived


class StreamCall:
    def __init__(
        self,
        deserialize: Callable[[bytes], Any],
        max_message_bytes: int,
        timeout: float | None,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._deserialize = deserialize
        self._max_message = max_message_bytes
        self._messages: collections.deque[bytes] = collections.deque()
        self._pending = bytearray()  # bytes of a message not complete yet
        self._waiter: asyncio.Future[None] | None = None
        self._status: grpc.StatusCode | None = None
        self._details = ""
        self._initial: list[tuple[str, str]] = []
        self._trailing: list[tuple[str, str]] = []
        self._got_headers = False
        self._callbacks: list[Callable[[Any], None]] = []
        self._cancelled = False
        self._connection: Any = None
        self._sid = 0
        self._timer = self._loop.call_later(timeout, self._expired) if timeout else None
        self.starter: asyncio.Task[None] | None = None  # connecting, when not yet connected
        self.sender: asyncio.Task[None] | None = None  # the body's rest, behind flow control
        self.send_window = 0  # set by the connection
        self.received = 0  # bytes not yet acknowledged with WINDOW_UPDATE

    # --- the caller's side -------------------------------------------------------------

    async def read(self) -> Any:
        while True:
            if self._messages:
                raw = self._messages.popleft()
                try:
                    return self._deserialize(raw)
                except Exception:
                    return None  # as grpc.aio: the caller treats it as a garbled frame
            if self._status is not None:
                if self._cancelled:
                    raise asyncio.CancelledError()
                if self._status is grpc.StatusCode.OK:
                    return grpc.aio.EOF
                raise self.error()
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def read_ready(self) -> Any:
        """The next message if it has arrived already, as :meth:`read` gives it, else
        :data:`NOT_READY`; the end of the call is left to :meth:`read`. Lets a reader take
        every message a burst brought without waiting in between."""
        if not self._messages:
            return NOT_READY
        raw = self._messages.popleft()
        try:
            return self._deserialize(raw)
        except Exception:
            return None

    def error(self) -> grpc.aio.AioRpcError:
        assert self._status is not None
        return grpc.aio.AioRpcError(
            self._status,
            grpc.aio.Metadata(*self._initial) if self._initial else _NO_METADATA,
            grpc.aio.Metadata(*self._trailing) if self._trailing else _NO_METADATA,
            self._details,
        )

    def cancel(self) -> bool:
        if self._status is not None:
            return False
        self._cancelled = True
        if self.starter is not None:
            self.starter.cancel()
        if self._connection is not None:
            self._connection.reset(self._sid, f.CANCEL)
        self._finish(grpc.StatusCode.CANCELLED, "Locally cancelled by application!")
        return True

    def done(self) -> bool:
        return self._status is not None

    def cancelled(self) -> bool:
        return self._cancelled

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        if self._status is not None:
            callback(self)
        else:
            self._callbacks.append(callback)

    # --- the connection's side ---------------------------------------------------------

    def bind(self, connection: Any, sid: int) -> None:
        self._connection, self._sid = connection, sid

    def on_data(self, data: bytes) -> None:
        pending = self._pending
        if not pending:
            # The usual DATA frame holds whole messages (a token's): take them from
            # ``data`` itself, and keep only a partial message's bytes.
            at = self._messages_in(data)
            if 0 <= at < len(data):
                pending += memoryview(data)[at:]
        else:
            pending += data
            at = self._messages_in(pending)
            if at > 0:
                del pending[:at]
        if at >= 0:
            self._wake()

    def _messages_in(self, data: bytes | bytearray) -> int:
        """Queue the whole messages at the start of ``data``; how many bytes they took
        (-1: the call was abandoned)."""
        at, end = 0, len(data)
        while end - at >= 5:
            length = unpack_u32(data, at + 1)[0]
            if length > self._max_message:
                self._abandon(grpc.StatusCode.RESOURCE_EXHAUSTED, "message larger than max")
                return -1
            if end - at < 5 + length:
                break
            if data[at]:
                self._abandon(grpc.StatusCode.INTERNAL, "compressed message; none was asked for")
                return -1
            self._messages.append(bytes(data[at + 5 : at + 5 + length]))
            at += 5 + length
        return at

    def on_headers(self, pairs: list[tuple[str, str]], end_stream: bool) -> None:
        if not self._got_headers:
            self._got_headers = True
            status = next((v for k, v in pairs if k == ":status"), "")
            if status != "200":
                code = _HTTP_STATUS.get(int(status) if status.isdigit() else 0)
                self._abandon(code or grpc.StatusCode.UNKNOWN, f"HTTP status {status}")
                return
            if not end_stream:  # else a trailers-only answer: these are the trailers
                self._initial = [p for p in pairs if not p[0].startswith(":")]
                return
        self._trailing = [p for p in pairs if not p[0].startswith(":")]
        if not end_stream:
            return  # a second header block that does not end the stream: nothing to do
        status_text = next((v for k, v in pairs if k == "grpc-status"), None)
        message = unquote(next((v for k, v in pairs if k == "grpc-message"), ""))
        if status_text is None or not status_text.isdigit():
            self._finish(grpc.StatusCode.UNKNOWN, message or "no grpc-status in the trailers")
        else:
            code = _BY_VALUE.get(int(status_text), grpc.StatusCode.UNKNOWN)
            if code is grpc.StatusCode.OK and self._pending:
                self._finish(grpc.StatusCode.INTERNAL, "the stream ended inside a message")
            else:
                self._finish(code, message)

    def on_end_without_trailers(self) -> None:
        self._finish(grpc.StatusCode.INTERNAL, "the server ended the stream without a status")

    def on_reset(self, error_code: int) -> None:
        code = _RESET_STATUS.get(error_code, grpc.StatusCode.INTERNAL)
        self._finish(code, f"stream removed (RST_STREAM, error code {error_code})")

    def on_failed(self, code: grpc.StatusCode, details: str) -> None:
        self._finish(code, details)

    # --- internals ---------------------------------------------------------------------

    def _expired(self) -> None:
        self._timer = None
        if self._status is None:
            if self.starter is not None:
                self.starter.cancel()
            if self._connection is not None:
                self._connection.reset(self._sid, f.CANCEL)
            self._finish(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

    def _abandon(self, code: grpc.StatusCode, details: str) -> None:
        if self._connection is not None:
            self._connection.reset(self._sid, f.CANCEL)
        self._finish(code, details)

    def _finish(self, code: grpc.StatusCode, details: str) -> None:
        if self._status is not None:
            return
        self._status, self._details = code, details
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.sender is not None and not self.sender.done():
            self.sender.cancel()
        self._wake()
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            with contextlib.suppress(Exception):
                callback(self)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
