"""An LRU of image features keyed by a digest, under a byte budget (E/P/D).

The same image often comes back (a conversation's earlier turns, a popular picture): an
encode worker that keeps its features answers without running the tower again, and a
prefill worker that keeps pulled features needs no second pull. Entries are charged every
byte of their tensors; the least recently used go first. ``capacity_bytes == 0`` turns
the cache off (every ``get`` misses, nothing is stored), so callers need no second path.

The key must name everything the features depend on: the model and the image (its
pixels and grid, or the hash of its encoded bytes for one preprocessing).
:func:`image_digest` is one such key.

Thread-safe: encodes finish on the encoder's thread while the event loop reads.
Entries are held by reference, never copied: callers must not modify them.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TypedDict

import numpy as np
from blake3 import blake3

from tandem.engine.types import ImageFeatures


class EmbeddingCacheCounters(TypedDict):
    hits: int
    misses: int
    evictions: int  # entries dropped to make room (not replacements of the same key)
    bytes: int
    entries: int
    capacity_bytes: int


def image_digest(model_id: str, pixels: np.ndarray, grid: np.ndarray | None) -> str:
    """A key for an image's features: the model, the pixel tensor (dtype, shape, bytes)
    and the grid. Two images differ in it whenever their pixels differ at all."""
    h = blake3()
    array = np.ascontiguousarray(pixels)
    for part in (model_id, str(array.dtype), repr(array.shape)):
        h.update(part.encode() + b"\0")
    h.update(b"" if grid is None else np.asarray(grid, dtype="<i8").tobytes() + b"\0")
    h.update(array.tobytes())
    return h.hexdigest()


class EmbeddingCache:
    def __init__(self, capacity_bytes: int) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self._entries: OrderedDict[str, tuple[ImageFeatures, int]] = OrderedDict()
        self._lock = threading.Lock()
        self._bytes = 0
        self._hits = 0
        self._misses = 0
        self._evictions = 0

    @property
    def enabled(self) -> bool:
        return self.capacity_bytes > 0

    def get(self, digest: str) -> ImageFeatures | None:
        """The features under ``digest`` (now the most recently used), or None: a miss."""
        with self._lock:
            entry = self._entries.get(digest)
            if entry is None:
                self._misses += 1
                return None
            self._entries.move_to_end(digest)
            self._hits += 1
            return entry[0]

    def put(self, digest: str, features: ImageFeatures) -> bool:
        """Keep ``features`` as the most recently used; False when it is not kept (the
        cache is off, or the entry alone is over the budget: it would evict everything
        and still not fit). Putting a key again replaces its entry."""
        size = features.nbytes
        with self._lock:
            old = self._entries.pop(digest, None)
            if old is not None:
                self._bytes -= old[1]
            if size > self.capacity_bytes:
                return False
            while self._bytes + size > self.capacity_bytes:
                _, (_, evicted) = self._entries.popitem(last=False)
                self._bytes -= evicted
                self._evictions += 1
            self._entries[digest] = (features, size)
            self._bytes += size
            return True

    def __contains__(self, digest: object) -> bool:
        """Whether ``digest`` is held; neither a hit nor a miss, and no change of order."""
        with self._lock:
            return digest in self._entries

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def counters(self) -> EmbeddingCacheCounters:
        with self._lock:
            return {
                "hits": self._hits,
                "misses": self._misses,
                "evictions": self._evictions,
                "bytes": self._bytes,
                "entries": len(self._entries),
                "capacity_bytes": self.capacity_bytes,
            }
