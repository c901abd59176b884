"""Flow control of Tandem's HTTP/2 client when the peer's WINDOW_UPDATE arrives before the
task that sends the rest of a large request has started.

A real socket cannot force that order (it depends on when the event loop polls), so this
test drives :class:`H2Connection` through a recording transport and feeds it the peer's
frames by hand; tests/unit/wire/test_h2grpc.py covers flow control against real servers.
"""

from __future__ import annotations

import asyncio

from tandem.wire.h2grpc import frames as f
from tandem.wire.h2grpc.call import StreamCall
from tandem.wire.h2grpc.connection import H2Connection


class RecordingTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()

    def write(self, data: bytes | bytearray | memoryview) -> None:
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
    sid = connection.open(call, b"", body)
    sent_at_once, _ = data_frames(bytes(transport.written), sid)
    assert sent_at_once == f.DEFAULT_WINDOW

    # The peer acknowledges everything before the sender task has run once.
    connection.data_received(f.window_update(0, 1 << 20) + f.window_update(sid, 1 << 20))
    for _ in range(5):
        await asyncio.sleep(0)

    sent, ended = data_frames(bytes(transport.written), sid)
    assert (sent, ended) == (len(body), True)
    assert call.sender is not None and call.sender.done()
