"""Byte-distinct copies of one JPEG without re-encoding it: a JPEG comment after SOI.

A pixel cache keyed by the encoded bytes (docs/benchmarks.md, "fresh images") would serve a
bench that repeats one body from memory. Every image a request sends is therefore made
distinct by a 12-byte COM segment right after the SOI marker: the pixels decode exactly as
before, the bytes (and so every cache key) differ. SOI + COM header + 12 bytes is 18 bytes,
a multiple of 3, so its base64 is a fixed 24 characters followed by the base64 of the rest
of the file unchanged: the load generator swaps those 24 characters per request without
touching the rest of a (megabyte) body, and Content-Length stays the same.

The same placeholder opens each scenario's prompt text (``bench.scenarios.fresh_text``), so
the text differs per request too: a prompt token cache would otherwise serve a repeated
body's text from memory.
"""

from __future__ import annotations

import base64
import os
import struct

TAG_BYTES = 12
PLACEHOLDER_TAG = b"TANDEMBENCH!"  # in the body files; replaced per request
SOI = b"\xff\xd8"


def com_prefix(tag: bytes) -> bytes:
    """SOI plus a COM segment carrying ``tag`` (exactly TAG_BYTES long)."""
    if len(tag) != TAG_BYTES:
        raise ValueError(f"tag must be {TAG_BYTES} bytes, got {len(tag)}")
    return SOI + b"\xff\xfe" + struct.pack(">H", 2 + TAG_BYTES) + tag


def prefix_b64(tag: bytes) -> bytes:
    return base64.b64encode(com_prefix(tag))


PLACEHOLDER = prefix_b64(PLACEHOLDER_TAG)  # 24 base64 characters


def tagged_b64(jpeg: bytes, tag: bytes = PLACEHOLDER_TAG) -> str:
    """base64 of ``jpeg`` with a COM segment carrying ``tag`` inserted after its SOI."""
    if not jpeg.startswith(SOI):
        raise ValueError("not a JPEG (no SOI marker)")
    return base64.b64encode(com_prefix(tag) + jpeg[2:]).decode()


def rest_b64(jpeg: bytes) -> str:
    """The part of :func:`tagged_b64` after the 24-character prefix (same for every tag)."""
    return tagged_b64(jpeg)[len(PLACEHOLDER) :]


def unique_tag(nonce: bytes, counter: int, index: int) -> bytes:
    """``nonce`` (4 bytes, one per load-generator run) + request counter + image index."""
    return nonce[:4] + struct.pack(">IxxH", counter & 0xFFFFFFFF, index & 0xFFFF)


def new_nonce() -> bytes:
    return os.urandom(4)


class Splicer:
    """Per-request payloads: each placeholder prefix in ``payload`` gets its own tag."""

    def __init__(self, payload: bytes, nonce: bytes | None = None) -> None:
        self.parts = payload.split(PLACEHOLDER)
        self.nonce = nonce if nonce is not None else new_nonce()
        self.count = 0

    @property
    def placeholders(self) -> int:
        """Images and prompt texts that get a tag of their own per request."""
        return len(self.parts) - 1

    def next(self) -> bytes:
        if not self.placeholders:
            return self.parts[0]
        counter, self.count = self.count, self.count + 1
        out = [self.parts[0]]
        for index, part in enumerate(self.parts[1:]):
            out.append(prefix_b64(unique_tag(self.nonce, counter, index)))
            out.append(part)
        return b"".join(out)
