"""HTTP/2 frame layout (RFC 9113 sections 4 and 6) and the gRPC message prefix, as bytes.

Only what a gRPC client needs: frame headers, the frames it sends (SETTINGS, its ACK,
WINDOW_UPDATE, PING ACK, RST_STREAM, HEADERS, DATA), and a request header block encoded
with literals that never touch the HPACK dynamic table (RFC 7541 section 6.2.2), so the
encoder keeps no state and the peer's table size setting does not concern it.
"""

from __future__ import annotations

import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE = 0, 1, 2, 3, 4, 5
PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 6, 7, 8, 9

END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

SETTINGS_HEADER_TABLE_SIZE = 0x1
SETTINGS_ENABLE_PUSH = 0x2
SETTINGS_MAX_CONCURRENT_STREAMS = 0x3
SETTINGS_INITIAL_WINDOW_SIZE = 0x4
SETTINGS_MAX_FRAME_SIZE = 0x5

# RST_STREAM / GOAWAY error codes (RFC 9113 section 7)
NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x3
REFUSED_STREAM, CANCEL, ENHANCE_YOUR_CALM, INADEQUATE_SECURITY = 0x7, 0x8, 0xB, 0xC

DEFAULT_WINDOW = 65_535
DEFAULT_MAX_FRAME = 16_384
MAX_WINDOW = 2**31 - 1

_HEADER = struct.Struct(">IBI")  # (length << 8 | type), flags, stream id
_U32 = struct.Struct(">I")
_SETTING = struct.Struct(">HI")


def header(length: int, kind: int, flags: int, stream_id: int) -> bytes:
    """The 9-byte frame header: 24-bit length, type, flags, 31-bit stream id."""
    return _HEADER.pack((length << 8) | kind, flags, stream_id & MAX_WINDOW)


def settings(values: dict[int, int]) -> bytes:
    payload = b"".join(_SETTING.pack(k, v) for k, v in values.items())
    return header(len(payload), SETTINGS, 0, 0) + payload


def parse_settings(payload: bytes) -> dict[int, int]:
    return {k: v for k, v in _SETTING.iter_unpack(payload[: len(payload) // 6 * 6])}


SETTINGS_ACK = header(0, SETTINGS, ACK, 0)


def window_update(stream_id: int, increment: int) -> bytes:
    return header(4, WINDOW_UPDATE, 0, stream_id) + _U32.pack(increment)


def rst_stream(stream_id: int, error_code: int) -> bytes:
    return header(4, RST_STREAM, 0, stream_id) + _U32.pack(error_code)


def ping_ack(payload: bytes) -> bytes:
    return header(len(payload), PING, ACK, 0) + payload


# ``(value,)`` of the 32-bit big-endian integer at an offset, for the paths run per frame
# (no Python call around the C one).
unpack_u32 = _U32.unpack_from


def u32(payload: bytes | bytearray | memoryview, at: int = 0) -> int:
    value: int = _U32.unpack_from(payload, at)[0]
    return value


def message_prefix(length: int) -> bytes:
    """gRPC's length-prefixed message header: not compressed, then the length."""
    return b"\x00" + _U32.pack(length)


# --- the request header block ------------------------------------------------------------


def _integer(value: int, prefix_bits: int, first: int) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _string(value: bytes) -> bytes:
    return _integer(len(value), 7, 0) + value  # not Huffman-coded


def literal(name_index: int, value: bytes) -> bytes:
    """ "Literal without indexing" with a name from the static table (RFC 7541 section 6.2.2)."""
    return _integer(name_index, 4, 0) + _string(value)


def literal_new(name: bytes, value: bytes) -> bytes:
    return b"\x00" + _string(name) + _string(value)


METHOD_POST = b"\x83"  # static table 3
SCHEME_HTTP = b"\x86"  # static table 6
_PATH, _AUTHORITY, _CONTENT_TYPE, _USER_AGENT = 4, 1, 31, 58


def request_block(authority: str, path: str, user_agent: str) -> bytes:
    """The part of every request's header block that is fixed for one method and peer."""
    return b"".join(
        (
            METHOD_POST,
            SCHEME_HTTP,
            literal(_PATH, path.encode()),
            literal(_AUTHORITY, authority.encode()),
            literal(_CONTENT_TYPE, b"application/grpc"),
            literal_new(b"te", b"trailers"),
            literal(_USER_AGENT, user_agent.encode()),
        )
    )


def timeout_field(seconds: float) -> bytes:
    """``grpc-timeout`` in the coarsest unit that keeps it within 8 digits."""
    micros = max(1, int(seconds * 1_000_000))
    if micros < 100_000_000:
        value = f"{micros}u"
    elif micros // 1000 < 100_000_000:
        value = f"{micros // 1000}m"
    else:
        value = f"{min(micros // 1_000_000, 99_999_999)}S"
    return literal_new(b"grpc-timeout", value.encode())


def metadata_fields(metadata: tuple[tuple[str, str], ...]) -> bytes:
    return b"".join(literal_new(k.lower().encode(), v.encode()) for k, v in metadata)
