"""The gateway's content keys of KV blocks, for a worker's published blocks and a request.

A worker's ``KvBlock.block_hash`` is its own int64 (vLLM's and Tandem's differ), so the
gateway never uses it as a key across workers. It keys every block by content, chained so
a key names its whole prefix:

    key_i = H(key_{i-1}, cache_salt, lora_name, token ids of block i,
              the identifiers of block i's multimodal extra keys, in order)

with ``key_{-1}`` a root that depends on the block size only. The offsets of the
multimodal keys are not folded in: a request knows where its images sit, and a block's
token ids already pin the overlap's position. Two same-size images expand to the same
placeholder ids, so the identifiers are what keeps their blocks apart (the red/blue
probe). Only blake2b over a length-framed encoding: every gateway replica, in every
process, computes the same keys (never Python's ``hash()``).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

DEFAULT_BLOCK_SIZE = 16  # Tandem's and vLLM's default; a worker's events say its own
KEY_BYTES = 16  # 128 bits: collisions are out of reach for any index this size
_VERSION = b"tandem-gateway-kv-key-v1"

ContentKey = bytes


def _frame(data: bytes) -> bytes:
    # Every variable-length field is length-prefixed: no two inputs share an encoding.
    return struct.pack("<Q", len(data)) + data


def _optional(text: str | None) -> bytes:
    # None and "" are different namespaces.
    return b"\x00" if text is None else b"\x01" + _frame(text.encode("utf-8"))


def root_key(block_size: int) -> ContentKey:
    """The parent of a chain's block 0 (blocks of another size never match)."""
    return hashlib.blake2b(_VERSION + struct.pack("<Q", block_size), digest_size=KEY_BYTES).digest()


def block_key(
    parent: ContentKey,
    cache_salt: str | None,
    lora_name: str | None,
    token_ids: Sequence[int],
    mm_identifiers: Sequence[str],
) -> ContentKey:
    h = hashlib.blake2b(parent, digest_size=KEY_BYTES)
    h.update(_optional(cache_salt))
    h.update(_optional(lora_name))
    h.update(struct.pack(f"<Q{len(token_ids)}Q", len(token_ids), *token_ids))
    h.update(struct.pack("<Q", len(mm_identifiers)))
    for identifier in mm_identifiers:
        h.update(_frame(identifier.encode("utf-8")))
    return h.digest()


def request_keys(
    token_ids: Sequence[int],
    media_runs: Sequence[tuple[int, int, str]],
    block_size: int = DEFAULT_BLOCK_SIZE,
    cache_salt: str | None = None,
    lora_name: str | None = None,
) -> list[ContentKey]:
    """One key per *full* block of a request's prompt (a worker caches whole blocks only).

    ``media_runs`` are ``(offset, length, mm_hash)``: each image's placeholder run inside
    ``token_ids``; a block's identifiers are those of the runs overlapping it, in position
    order, as a worker lists its ``extra_keys``.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    runs = sorted((r for r in media_runs if r[1] > 0), key=lambda r: (r[0], r[1], r[2]))
    keys: list[ContentKey] = []
    parent = root_key(block_size)
    first_run = 0  # runs ending before the current block are skipped for good
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        end = start + block_size
        while first_run < len(runs) and runs[first_run][0] + runs[first_run][1] <= start:
            first_run += 1
        ids = [
            mm_hash
            for offset, length, mm_hash in runs[first_run:]
            if offset < end and offset + length > start
        ]
        parent = block_key(parent, cache_salt, lora_name, token_ids[start:end], ids)
        keys.append(parent)
    return keys
