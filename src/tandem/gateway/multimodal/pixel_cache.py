"""Per-image processed-pixel cache (``--mm-pixel-cache-mb``), LRU by bytes.

Key: the BLAKE3 of the image's encoded bytes and a fingerprint of what turns those bytes
into pixels (the model id, its pickled processor config, raw or normalized output, the
decode options), so an entry never serves another model or another preprocessing. Value:
that one image's preprocessed pixels, token count, grid and patch count. Per image, so a
multi-image request or a chat that re-sends earlier images hits on each image it repeats.

Entries are read-only (``flags.writeable = False``): a request's batch is built from them
by copying (gateway/multimodal/process.py), or, for a single image, handed out as the
read-only array itself, which nothing downstream writes into (the wire code only reads
pixels). The cache is touched from the event loop only.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from tandem.gateway import metrics

CacheKey = tuple[str, str]  # (BLAKE3 hex of the encoded bytes, processing fingerprint)


@dataclass(frozen=True, slots=True)
class OneImage:
    """One image's preprocessed arrays, as the processor made them for that image alone."""

    pixels: np.ndarray  # read-only
    tokens: int
    grids: dict[str, np.ndarray]  # e.g. image_grid_thw of shape [1, 3]
    patches: np.ndarray | None  # int64 [1] for flat pixel layouts
    lut: np.ndarray | None  # the processor's normalize LUT when pixels are raw uint8

    @property
    def nbytes(self) -> int:
        extra = sum(a.nbytes for a in self.grids.values())
        return self.pixels.nbytes + extra + (0 if self.patches is None else self.patches.nbytes)


def frozen(image: OneImage) -> OneImage:
    """``image`` with every array read-only (the cached copy is shared between requests)."""
    for array in (image.pixels, *image.grids.values(), image.patches, image.lut):
        if array is not None and array.flags.writeable:
            array.flags.writeable = False
    return image


class PixelCache:
    """LRU of :class:`OneImage` by bytes. ``max_bytes=0``: off (every lookup misses)."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("the pixel cache size must be >= 0")
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._entries: OrderedDict[CacheKey, OneImage] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def get(self, key: CacheKey) -> OneImage | None:
        if not self.enabled:
            return None
        image = self._entries.get(key)
        if image is None:
            metrics.MM_PIXEL_CACHE_MISSES.inc()
            return None
        self._entries.move_to_end(key)
        metrics.MM_PIXEL_CACHE_HITS.inc()
        return image

    def put(self, key: CacheKey, image: OneImage) -> None:
        """Keep ``image`` (made read-only); an image larger than the whole cache is not kept."""
        if not self.enabled or image.nbytes > self.max_bytes:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self.nbytes -= old.nbytes
        self._entries[key] = frozen(image)
        self.nbytes += image.nbytes
        while self.nbytes > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.nbytes -= evicted.nbytes
        metrics.MM_PIXEL_CACHE_BYTES.set(self.nbytes)

    def clear(self) -> None:
        self._entries.clear()
        self.nbytes = 0
        metrics.MM_PIXEL_CACHE_BYTES.set(0)
