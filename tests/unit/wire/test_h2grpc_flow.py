"""Flow control of Tandem's HTTP/2 client when the peer's WINDOW_UPDATE arrives before the
task that sends the rest of a large request has started.

A real socket cannot force that order (it depends on when the event loop polls), so this
test drives :class:`H2Connection` through a recording transport and feeds it the peer's
frames by hand; tests/unit/wire/test_h2grpc.py covers flow control against real servers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from tandem.wire.h2grpc import frames as f
from tandem.wire.h2grpc.call import NOT_READY, StreamCall
from tandem.wire.h2grpc.connection import H2Connection


class RecordingTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.pieces: list[bytes | bytearray | memoryview] = []  # as handed to writelines

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:
        for data in list_of_data:
            self.pieces.append(data)
            self.written += data

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass


def data_frames(wire: bytes, sid: int) -> tuple[int, bool]:
    """Payload bytes of the DATA frames for ``sid`` in ``wire`` (after the preface and our
    SETTINGS), and whether one of them ended the stream."""
    at = len(f.PREFACE)
    total, ended = 0, False
    while at + 9 <= len(wire):
        length = int.from_bytes(wire[at : at + 3], "big")
        kind, flags, stream = wire[at + 3], wire[at + 4], f.u32(wire, at + 5) & f.MAX_WINDOW
        if kind == f.DATA and stream == sid:
            total += length
            ended = ended or bool(flags & f.END_STREAM)
        at += 9 + length
    return total, ended


async def test_a_window_update_read_before_the_sender_starts_is_not_lost() -> None:
    connection = H2Connection()
    transport = RecordingTransport()
    connection.connection_made(transport)
    connection.data_received(f.settings({}))  # the peer's SETTINGS: default windows
    call = StreamCall(lambda raw: raw, max_message_bytes=1 << 20, timeout=None)
    body = b"x" * 200_000  # about three times the default 65,535-byte windows
    sid = connection.open(call, b"", f.message_prefix(len(body)), (body,))
    sent_at_once, _ = data_frames(bytes(transport.written), sid)
    assert sent_at_once == f.DEFAULT_WINDOW

    # The peer acknowledges everything before the sender task has run once.
    connection.data_received(f.window_update(0, 1 << 20) + f.window_update(sid, 1 << 20))
    for _ in range(5):
        await asyncio.sleep(0)

    sent, ended = data_frames(bytes(transport.written), sid)
    assert (sent, ended) == (5 + len(body), True)
    assert call.sender is not None and call.sender.done()


def payload(wire: bytes, sid: int) -> bytes:
    """The DATA frames' payloads for ``sid`` in ``wire``, joined in order."""
    at, out = len(f.PREFACE), bytearray()
    while at + 9 <= len(wire):
        length = int.from_bytes(wire[at : at + 3], "big")
        kind, stream = wire[at + 3], f.u32(wire, at + 5) & f.MAX_WINDOW
        if kind == f.DATA and stream == sid:
            out += wire[at + 9 : at + 9 + length]
        at += 9 + length
    return bytes(out)


async def test_a_large_message_goes_out_as_views_of_itself_in_order() -> None:
    """Its DATA frames are slices of the caller's parts (no copy of a 12 MiB image), the
    gRPC prefix in a frame of its own, the parts end to end; a small message is one frame
    of prefix and parts."""
    connection = H2Connection()
    transport = RecordingTransport()
    connection.connection_made(transport)
    connection.data_received(f.settings({}) + f.window_update(0, 1 << 24))
    connection.data_received(f.settings({f.SETTINGS_INITIAL_WINDOW_SIZE: 1 << 24}))
    call = StreamCall(lambda raw: raw, max_message_bytes=1 << 20, timeout=None)
    message = bytes(range(256)) * 1024  # 256 KiB, every frame's place checkable
    prefix = f.message_prefix(len(message))
    sid = connection.open(call, b"", prefix, (message[:1000], memoryview(message)[1000:]))
    assert payload(bytes(transport.written), sid) == prefix + message
    views = [p for p in transport.pieces if isinstance(p, memoryview) and p.obj is message]
    assert sum(len(v) for v in views) == len(message) - 1000  # the first part was a copy
    assert data_frames(bytes(transport.written), sid) == (len(prefix) + len(message), True)

    small_call = StreamCall(lambda raw: raw, max_message_bytes=1 << 20, timeout=None)
    before = len(transport.written)
    small = connection.open(small_call, b"", f.message_prefix(3), (b"ab", b"c"))
    frames = bytes(transport.written[before:])
    assert payload(f.PREFACE + frames, small) == f.message_prefix(3) + b"abc"
    assert len(frames) == 9 + 9 + 5 + 3  # HEADERS (empty block), then one DATA frame


def answer_wire(sid: int, messages: list[bytes]) -> bytes:
    """The messages gRPC-prefixed end to end, cut into DATA frames that do not respect
    their bounds (a message across frames, several in one, a frame of 1 byte)."""
    body = b"".join(f.message_prefix(len(m)) + m for m in messages)
    wire, at = bytearray(), 0
    for size in [1, 7, 40, 3, 200, 5, 9, 1000, len(body)]:
        piece = body[at : at + size]
        if not piece:
            break
        wire += f.header(len(piece), f.DATA, 0, sid) + piece
        at += len(piece)
    return bytes(wire)


async def test_an_answer_cut_anywhere_reads_as_the_same_messages() -> None:
    """However the socket cuts the answer's bytes (within a frame header, a gRPC prefix or
    a message), each read picks up where the last stopped and the messages come out whole
    and in order, PING frames between them answered."""
    messages = [b"", b"a", b"token", bytes(range(256)) * 3, b"x" * 70, b"end"]
    for cuts in ([1], [2, 3], [9], [10, 4], [13], [64, 1], [4096]):
        connection = H2Connection()
        transport = RecordingTransport()
        connection.connection_made(transport)
        connection.data_received(f.settings({}))
        call = StreamCall(lambda raw: raw, max_message_bytes=1 << 20, timeout=None)
        sid = connection.open(call, b"", f.message_prefix(1), (b"q",))
        ping = f.header(8, f.PING, 0, 0) + b"pingpong"
        wire = answer_wire(sid, messages[:3]) + ping + answer_wire(sid, messages[3:])
        at, turn = 0, 0
        while at < len(wire):
            step = cuts[turn % len(cuts)]
            connection.data_received(wire[at : at + step])
            at, turn = at + step, turn + 1
        got = []
        while (message := call.read_ready()) is not NOT_READY:
            got.append(message)
        assert got == messages, cuts
        assert f.ping_ack(b"pingpong") in transport.written
