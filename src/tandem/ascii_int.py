"""Whole numbers from text that a client or a peer controls: ASCII digits only.

``str.isdigit`` is true for "²" and other Unicode digits that ``int`` refuses, so
``int(s) if s.isdigit()`` raises on input such as ``?limit=²`` or a Latin-1 header value;
every such parse goes through here instead.
"""

from __future__ import annotations


def ascii_int(text: str | None) -> int | None:
    """``text`` as a non-negative integer when it is one or more ASCII digits, else None."""
    if not text or not (text.isascii() and text.isdigit()):
        return None
    return int(text)
