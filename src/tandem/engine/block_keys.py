"""Content keys for prefix-cache blocks, with media identity folded in.

Two same-resolution images behind the same text expand to identical placeholder-token
runs, so keys built from token ids alone would let one image's KV answer for the other.
Each block key therefore also covers the hash of every image whose placeholder range
touches the block, plus the request's cache salt (``"mm:" + hashes`` on pixel-less legs,
where the media items may be unknown). Keys are chained so a key names its whole prefix.

Only stable hashes are used (blake2b over an unambiguous byte encoding), never Python's
``hash()``: a prefill and a decode worker must compute the same keys for the same input.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

from tandem.engine.types import MediaItem

DEFAULT_BLOCK_SIZE = 16
KEY_BYTES = 32
_VERSION = b"tandem-block-key-v1"


def _frame(data: bytes) -> bytes:
    # Length-prefix every variable field so that no two inputs share an encoding.
    return struct.pack("<Q", len(data)) + data


def _root(block_size: int) -> bytes:
    # The chain's parent for block 0; the block size is part of what a key means.
    return hashlib.blake2b(_VERSION + struct.pack("<Q", block_size), digest_size=KEY_BYTES).digest()


def block_keys(
    token_ids: Sequence[int],
    media: Sequence[MediaItem],
    cache_salt: str | None,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> list[bytes]:
    """One key per full block of ``token_ids``; a trailing partial block gets none.

    ``key_i = H(key_{i-1} | salt | tokens of block i | media overlapping block i)``, where
    each overlapping item contributes its ``mm_hash``, where the overlap starts inside the
    item, and where it starts inside the block.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    for item in media:
        if item.offset < 0 or item.length < 0:
            raise ValueError(
                f"media item {item.mm_hash!r} has a negative offset or length "
                f"(offset={item.offset}, length={item.length})"
            )
    # Sort by position so the keys do not depend on the order the caller listed items in.
    items = sorted(
        (m for m in media if m.length > 0), key=lambda m: (m.offset, m.length, m.mm_hash)
    )
    salt = b"\x00" if cache_salt is None else b"\x01" + _frame(cache_salt.encode("utf-8"))

    keys: list[bytes] = []
    parent = _root(block_size)
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        end = start + block_size
        h = hashlib.blake2b(digest_size=KEY_BYTES)
        h.update(parent)
        h.update(salt)
        h.update(struct.pack(f"<{block_size}q", *token_ids[start:end]))
        for item in items:
            if item.offset >= end:
                break  # sorted by offset: no later item reaches this block
            lo = max(start, item.offset)
            if lo >= item.offset + item.length:
                continue  # the item ends before this block
            h.update(b"\x02")
            h.update(_frame(item.mm_hash.encode("utf-8")))
            h.update(struct.pack("<QQ", lo - item.offset, lo - start))
        parent = h.digest()
        keys.append(parent)
    return keys


def hash_salt(hashes: Sequence[str]) -> str | None:
    """The cache salt of a request whose media identity is only its hashes.

    Order-sensitive and deterministic (``["h1", "h2"]`` → ``"mm:h1,h2"``); None when
    there are no hashes, so text-only requests stay unsalted and share cache entries.
    """
    if not hashes:
        return None
    return "mm:" + ",".join(hashes)
