"""The few pieces of protobuf's binary encoding that splicing a payload into a message needs.

A length-delimited field is its key (field number, wire type 2) as a varint, the payload's
length as a varint, then the payload. Protobuf merges repeated occurrences of a singular
message field, so such bytes appended to a serialized message add to it (``pixel_splice.py``).
"""

from __future__ import annotations

_LENGTH_DELIMITED = 2


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def field_key(field: int) -> bytes:
    """The key of a length-delimited field (a message, bytes or a string)."""
    return varint(field << 3 | _LENGTH_DELIMITED)


def delimited_head(field: int, length: int) -> bytes:
    """What precedes a length-delimited payload of ``length`` bytes."""
    return field_key(field) + varint(length)
