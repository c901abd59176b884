"""One HTTP/2 connection to a gRPC server, as an asyncio protocol (client side only).

Frames are parsed straight from ``data_received``; each stream's bytes go to its
:class:`~tandem.wire.h2grpc.call.StreamCall`. Flow control: we open large receive windows
at the start and top them up as data is consumed; the sending side honours the peer's
windows (a large prefill request with pixels waits for WINDOW_UPDATE frames). A broken
connection or a GOAWAY fails the streams it takes with UNAVAILABLE, in gRPC core's words
(``tandem.errors.transport_failure`` recognises them).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import grpc

from tandem.wire.h2grpc import frames as f
from tandem.wire.h2grpc.frames import unpack_u32
from tandem.wire.h2grpc.header_blocks import HeaderBlockDecoder

if TYPE_CHECKING:
    from tandem.wire.h2grpc.call import StreamCall

log = logging.getLogger("tandem.wire.h2grpc")

RECEIVE_WINDOW = 1 << 30  # bytes the peer may send before we acknowledge any
TOP_UP_AT = RECEIVE_WINDOW // 2
# A message, or the parts of one, that a sender hands over to be written end to end.
MessageParts = tuple[bytes | memoryview, ...]
# A message shorter than this is joined to its gRPC prefix (one DATA frame, as before):
# the copy costs less than a frame and a writev buffer more.
_COPY_BELOW = 1 << 16


class H2Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.settled: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.closed_reason: str | None = None  # no new streams once set
        self._buffer = bytearray()
        self._decoder = HeaderBlockDecoder()
        self._streams: dict[int, StreamCall] = {}
        self._next_id = 1
        self._max_frame = f.DEFAULT_MAX_FRAME
        self._initial_window = f.DEFAULT_WINDOW
        self._max_streams = f.MAX_WINDOW
        self._send_window = f.DEFAULT_WINDOW
        self._unacked = 0
        self._continuing: tuple[int, int, bytearray] | None = None  # id, flags, block
        self._window_waiters: list[asyncio.Future[None]] = []
        self._room_waiters: list[asyncio.Future[None]] = []

    # --- used by calls ------------------------------------------------------------------

    @property
    def usable(self) -> bool:
        return self.closed_reason is None and self._next_id < f.MAX_WINDOW - 2

    @property
    def has_room(self) -> bool:
        return len(self._streams) < self._max_streams

    async def wait_room(self) -> None:
        """Until the peer's MAX_CONCURRENT_STREAMS lets one more stream open."""
        while not self.has_room and self.usable:
            waiter = asyncio.get_running_loop().create_future()
            self._room_waiters.append(waiter)
            await waiter

    def open(self, call: StreamCall, block: bytes, prefix: bytes, parts: MessageParts) -> int:
        """Start a stream: HEADERS, then as much of ``prefix`` (the gRPC length prefix) and
        the message, ``parts`` end to end, as the windows allow now (the rest follows from
        a task); returns the stream id.

        A large message is never copied here: its DATA frames are memoryviews of its
        parts, handed to the transport with ``writelines`` (uvloop writes them with one
        ``writev``), and the prefix goes in a DATA frame of its own. With the pixels as a
        part of their own (``tandem.wire.pixel_splice.message_parts``), an inline image's
        float32 pixels go from their array to the socket; they were copied three times.
        """
        assert self.transport is not None and self.usable
        sid = self._next_id
        self._next_id += 2
        self._streams[sid] = call
        call.bind(self, sid)
        call.send_window = self._initial_window
        out: list[bytes | memoryview] = [f.header(len(block), f.HEADERS, f.END_HEADERS, sid), block]
        if sum(len(part) for part in parts) < _COPY_BELOW:
            pending = [memoryview(b"".join((prefix, *parts)))]  # one frame, as before
        else:
            pending = [memoryview(prefix), *(memoryview(part) for part in parts if len(part))]
        self._data_frames(call, sid, pending, out)
        self.transport.writelines(out)
        if pending:
            call.sender = asyncio.get_running_loop().create_task(
                self._send_rest(call, sid, pending)
            )
        return sid

    def reset(self, sid: int, code: int = f.CANCEL) -> None:
        """Forget stream ``sid`` and tell the peer (RST_STREAM) if it is still open there."""
        transport = self.transport
        if self._streams.pop(sid, None) is not None and transport and not transport.is_closing():
            transport.write(f.rst_stream(sid, code))
        self._maybe_finish_closing()

    def forget(self, sid: int) -> None:
        self._streams.pop(sid, None)
        self._maybe_finish_closing()

    def close(self) -> None:
        self.closed_reason = self.closed_reason or "the channel was closed"
        if self.transport is not None:
            self.transport.close()

    # --- sending ------------------------------------------------------------------------

    def _data_frames(
        self, call: StreamCall, sid: int, pending: list[memoryview], out: list[bytes | memoryview]
    ) -> None:
        """DATA frames of ``pending``'s bytes as far as the windows allow, into ``out``;
        what was framed leaves ``pending``. No frame spans two of its buffers."""
        while pending:
            room = min(self._send_window, call.send_window, self._max_frame)
            if room <= 0:
                return
            piece = pending[0]
            chunk = piece[:room]
            if len(chunk) == len(piece):
                pending.pop(0)
            else:
                pending[0] = piece[room:]
            flags = 0 if pending else f.END_STREAM
            out.append(f.header(len(chunk), f.DATA, flags, sid))
            out.append(chunk)
            self._send_window -= len(chunk)
            call.send_window -= len(chunk)

    async def _send_rest(self, call: StreamCall, sid: int, pending: list[memoryview]) -> None:
        # Send before waiting: the peer's WINDOW_UPDATE may have been read between open()
        # and this task's first step (uvloop polls I/O before it runs new tasks), and a
        # wake-up with no waiter registered is lost.
        while sid in self._streams and self.transport is not None:
            if self.transport.is_closing():
                return
            out: list[bytes | memoryview] = []
            self._data_frames(call, sid, pending, out)
            if out:
                self.transport.writelines(out)
            if not pending:
                return
            waiter = asyncio.get_running_loop().create_future()
            self._window_waiters.append(waiter)
            await waiter

    def _wake_senders(self) -> None:
        waiters, self._window_waiters = self._window_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    # --- receiving ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        assert self.transport is not None
        ours = {
            f.SETTINGS_ENABLE_PUSH: 0,
            f.SETTINGS_INITIAL_WINDOW_SIZE: RECEIVE_WINDOW,
            f.SETTINGS_MAX_FRAME_SIZE: 1 << 20,
        }
        grow = f.window_update(0, RECEIVE_WINDOW - f.DEFAULT_WINDOW)
        self.transport.write(f.PREFACE + f.settings(ours) + grow)

    def connection_lost(self, exc: Exception | None) -> None:
        reason = f"socket closed ({exc})" if exc else "socket closed"
        if isinstance(exc, ConnectionResetError):
            reason = f"connection reset ({exc})"
        self.closed_reason = self.closed_reason or reason
        self._fail_all(self.closed_reason, only_after=0)
        self._maybe_finish_closing()
        if not self.settled.done():
            self.settled.set_exception(ConnectionError(reason))
        self._wake_senders()

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        if not buffer:
            # The usual read holds whole frames (a token's DATA frame): read them from
            # ``data`` itself, and keep only a partial frame's bytes for the next read.
            at = self._frames(data)
            if 0 <= at < len(data):
                buffer += memoryview(data)[at:]
            return
        buffer += data
        at = self._frames(buffer)
        if at > 0:
            del buffer[:at]

    def _frames(self, data: bytes | bytearray) -> int:
        """Handle the whole frames at the start of ``data``; how many bytes they took
        (-1: the connection was dropped)."""
        at, end = 0, len(data)
        while end - at >= 9:
            length = int.from_bytes(data[at : at + 3], "big")
            if end - at < 9 + length:
                break
            kind, flags = data[at + 3], data[at + 4]
            sid = unpack_u32(data, at + 5)[0] & f.MAX_WINDOW
            payload = bytes(data[at + 9 : at + 9 + length])  # a bytes slice: one copy
            at += 9 + length
            try:
                self._frame(kind, flags, sid, payload)
            except Exception as err:  # a peer that breaks the protocol: drop the connection
                log.warning("HTTP/2 connection dropped: %s", err)
                self._fail_all(f"connection reset (protocol error: {err})", only_after=0)
                self.close()
                self._buffer.clear()
                return -1
        return at

    def _frame(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        if self._continuing is not None and kind != f.CONTINUATION:
            raise ValueError("a header block was interrupted")
        if kind == f.DATA:
            self._data(flags, sid, payload)
        elif kind == f.HEADERS:
            self._headers(flags, sid, payload)
        elif kind == f.CONTINUATION:
            if self._continuing is None or self._continuing[0] != sid:
                raise ValueError("CONTINUATION without a header block")
            self._continuing[2].extend(payload)
            if flags & f.END_HEADERS:
                first_sid, first_flags, block = self._continuing
                self._continuing = None
                self._header_block(first_sid, first_flags, bytes(block))
        elif kind == f.SETTINGS:
            if not flags & f.ACK:
                self._settings(f.parse_settings(payload))
        elif kind == f.WINDOW_UPDATE:
            self._window_update(sid, f.u32(payload) & f.MAX_WINDOW)
        elif kind == f.PING:
            if not flags & f.ACK and self.transport is not None:
                self.transport.write(f.ping_ack(payload))
        elif kind == f.RST_STREAM:
            call = self._streams.pop(sid, None)
            if call is not None:
                call.on_reset(f.u32(payload))
            self._maybe_finish_closing()
        elif kind == f.GOAWAY:
            self._goaway(f.u32(payload) & f.MAX_WINDOW, f.u32(payload, 4))
        elif kind == f.PUSH_PROMISE:
            raise ValueError("PUSH_PROMISE although push is disabled")
        # PRIORITY and unknown frame types are ignored (RFC 9113 section 5.5)

    def _data(self, flags: int, sid: int, payload: bytes) -> None:
        size = len(payload)
        if flags & f.PADDED:
            payload = payload[1 : size - payload[0]]
        self._unacked += size
        if self._unacked >= TOP_UP_AT and self.transport is not None:
            self.transport.write(f.window_update(0, self._unacked))
            self._unacked = 0
        call = self._streams.get(sid)
        if call is None:
            return  # a stream we reset: its bytes still counted against the window
        call.received += size
        if call.received >= TOP_UP_AT and self.transport is not None:
            self.transport.write(f.window_update(sid, call.received))
            call.received = 0
        call.on_data(payload)
        if flags & f.END_STREAM:
            self.forget(sid)
            call.on_end_without_trailers()

    def _headers(self, flags: int, sid: int, payload: bytes) -> None:
        if flags & f.PADDED:
            payload = payload[1 : len(payload) - payload[0]]
        if flags & f.PRIORITY_FLAG:
            payload = payload[5:]
        if flags & f.END_HEADERS:
            self._header_block(sid, flags, payload)
        else:
            self._continuing = (sid, flags, bytearray(payload))

    def _header_block(self, sid: int, flags: int, block: bytes) -> None:
        # Decoded even for streams we reset: the HPACK table is shared by the connection.
        fields = self._decoder.decode(block)
        call = self._streams.get(sid)
        if call is None:
            return
        end = bool(flags & f.END_STREAM)
        if end:
            self.forget(sid)
        call.on_headers(fields, end)

    def _settings(self, values: dict[int, int]) -> None:
        if f.SETTINGS_INITIAL_WINDOW_SIZE in values:
            new = values[f.SETTINGS_INITIAL_WINDOW_SIZE]
            delta, self._initial_window = new - self._initial_window, new
            for call in self._streams.values():
                call.send_window += delta
        if f.SETTINGS_MAX_FRAME_SIZE in values:
            self._max_frame = values[f.SETTINGS_MAX_FRAME_SIZE]
        if f.SETTINGS_MAX_CONCURRENT_STREAMS in values:
            self._max_streams = values[f.SETTINGS_MAX_CONCURRENT_STREAMS]
        if self.transport is not None:
            self.transport.write(f.SETTINGS_ACK)
        if not self.settled.done():
            self.settled.set_result(None)
        self._wake_senders()

    def _window_update(self, sid: int, increment: int) -> None:
        if sid == 0:
            self._send_window += increment
        elif (call := self._streams.get(sid)) is not None:
            call.send_window += increment
        self._wake_senders()

    def _goaway(self, last_sid: int, error_code: int) -> None:
        self.closed_reason = f"goaway received (error code {error_code})"
        self._fail_all(self.closed_reason, only_after=last_sid)
        self._maybe_finish_closing()

    def _fail_all(self, reason: str, only_after: int) -> None:
        doomed = [sid for sid in self._streams if sid > only_after]
        for sid in doomed:
            call = self._streams.pop(sid)
            call.on_failed(grpc.StatusCode.UNAVAILABLE, reason)

    def _maybe_finish_closing(self) -> None:
        if self._room_waiters and (self.has_room or not self.usable):
            waiters, self._room_waiters = self._room_waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
        if self.closed_reason is not None and not self._streams and self.transport is not None:
            self.transport.close()
