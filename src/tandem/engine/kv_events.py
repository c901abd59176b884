"""What the prefix cache tells a listener about its contents (issue 36, docs/worker-protocols.md).

The cache (``engine/prefix_cache.py``) knows only keys; the engine knows what the keys
were computed from. It hands the cache a :class:`BlockSource` with each insert, and the
cache turns it into :class:`BlockContent` only for the blocks it actually added, and
only when a listener is attached: the no-listener path costs nothing.

A :class:`KvEventSink` is called with the cache lock held, so that the order of its calls
is the order in which the cache changed. It must therefore never block: the worker's
publisher (``worker/kv_events/publisher.py``) only schedules the batch onto its event
loop (``loop.call_soon_threadsafe``) and returns; no subscriber queue is written there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from tandem.engine.types import MediaItem


@dataclass(frozen=True, slots=True)
class MediaOverlap:
    """One media item overlapping a block: its hash and where the overlap starts inside it."""

    mm_hash: str
    offset: int


@dataclass(frozen=True, slots=True)
class BlockContent:
    """What one prefix-cache block's key was computed from (``engine/block_keys.py``)."""

    key: bytes
    token_ids: tuple[int, ...]
    media: tuple[MediaOverlap, ...]
    salt: str | None


@dataclass(frozen=True, slots=True)
class BlocksStored:
    """Consecutive blocks of one chain newly cached; ``parent`` is the key before the first
    (None when the first block is the chain's block 0)."""

    blocks: tuple[BlockContent, ...]
    parent: bytes | None


@dataclass(frozen=True, slots=True)
class BlocksRemoved:
    keys: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class CacheCleared:
    pass


KvEvent = BlocksStored | BlocksRemoved | CacheCleared


class KvEventSink(Protocol):
    def publish(self, events: Sequence[KvEvent]) -> None:
        """One batch of changes, in order; called under the cache lock: must not block."""
        ...


@dataclass(frozen=True, slots=True)
class BlockSource:
    """The inputs of ``block_keys``: enough to describe any of the keys it returned."""

    token_ids: Sequence[int]
    media: Sequence[MediaItem]
    salt: str | None
    block_size: int

    def content(self, index: int, key: bytes) -> BlockContent:
        """Block ``index``'s content, its overlaps in position order as the key folded them."""
        start = index * self.block_size
        end = start + self.block_size
        items = sorted(
            (m for m in self.media if m.length > 0), key=lambda m: (m.offset, m.length, m.mm_hash)
        )
        overlaps = []
        for item in items:
            if item.offset >= end:
                break
            lo = max(start, item.offset)
            if lo >= item.offset + item.length:
                continue
            overlaps.append(MediaOverlap(item.mm_hash, lo - item.offset))
        return BlockContent(
            key, tuple(int(t) for t in self.token_ids[start:end]), tuple(overlaps), self.salt
        )
