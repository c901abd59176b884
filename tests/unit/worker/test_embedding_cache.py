"""The image-features LRU: order, byte budget, counters, an entry over the budget, and keys
that tell two images apart."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from tandem.engine.types import ImageFeatures
from tandem.models import load_processor
from tandem.worker.embedding_cache import EmbeddingCache, image_digest


def features(tokens: int, hidden: int = 4, deepstack: int = 0) -> ImageFeatures:
    """float32 features of ``tokens * hidden * (1 + deepstack) * 4`` bytes."""
    return ImageFeatures(
        torch.rand(tokens, hidden), [torch.rand(tokens, hidden) for _ in range(deepstack)]
    )


def test_size_counts_every_tensor() -> None:
    assert features(2, 4).nbytes == 32
    assert features(2, 4, deepstack=3).nbytes == 128
    half = ImageFeatures(torch.zeros(2, 4, dtype=torch.float16))
    assert half.nbytes == 16


def test_least_recently_used_goes_first() -> None:
    cache = EmbeddingCache(3 * 32)
    a, b, c, d = (features(2) for _ in range(4))
    for key, value in (("a", a), ("b", b), ("c", c)):
        assert cache.put(key, value)
    assert cache.get("a") is a  # a is now the most recent: b goes next
    assert cache.put("d", d)
    assert "b" not in cache and {"a", "c", "d"} == {k for k in "abcd" if k in cache}
    assert cache.get("b") is None
    assert cache.counters() == {
        "hits": 1,
        "misses": 1,
        "evictions": 1,
        "bytes": 96,
        "entries": 3,
        "capacity_bytes": 96,
    }


def test_a_big_entry_evicts_as_many_as_it_needs() -> None:
    cache = EmbeddingCache(100)
    for key in "abc":
        cache.put(key, features(1))  # 16 bytes each
    assert cache.put("big", features(4, hidden=5))  # 80 bytes: a and b must go
    assert ["c" in cache, "a" in cache, "b" in cache] == [True, False, False]
    counters = cache.counters()
    assert (counters["evictions"], counters["bytes"], counters["entries"]) == (2, 96, 2)


def test_an_entry_over_the_budget_is_not_stored() -> None:
    cache = EmbeddingCache(64)
    cache.put("small", features(1))
    assert not cache.put("huge", features(5))  # 80 bytes > 64
    assert "huge" not in cache and "small" in cache  # nothing was evicted for it
    assert cache.counters()["evictions"] == 0 and cache.counters()["bytes"] == 16


def test_putting_a_key_again_replaces_it() -> None:
    cache = EmbeddingCache(1000)
    cache.put("k", features(2))
    newer = features(3)
    cache.put("k", newer)
    assert cache.get("k") is newer
    assert cache.counters()["bytes"] == 48 and len(cache) == 1
    assert cache.counters()["evictions"] == 0


def test_capacity_zero_disables_the_cache() -> None:
    cache = EmbeddingCache(0)
    assert not cache.enabled
    assert not cache.put("k", features(1))
    assert cache.get("k") is None
    assert cache.counters()["misses"] == 1 and cache.counters()["entries"] == 0
    with pytest.raises(ValueError):
        EmbeddingCache(-1)


def test_threads_keep_the_books_straight() -> None:
    cache = EmbeddingCache(50 * 16)

    def work(offset: int) -> None:
        for i in range(200):
            cache.put(f"{offset}-{i % 80}", features(1))
            cache.get(f"{offset}-{(i * 7) % 80}")

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    counters = cache.counters()
    assert counters["hits"] + counters["misses"] == 800
    assert counters["bytes"] == 16 * counters["entries"] <= 50 * 16


def test_same_size_images_of_different_colours_have_different_digests(
    qwen_meta_dir: Path, llava_meta_dir: Path
) -> None:
    for model_dir, model in ((qwen_meta_dir, "tiny-qwen3-vl"), (llava_meta_dir, "tiny-llava")):
        processor = load_processor(model_dir)
        keys = {}
        for colour, rgb in (("red", (255, 0, 0)), ("blue", (0, 0, 255))):
            pre = processor.preprocess([Image.new("RGB", (128, 128), rgb)])
            grid = pre.grids.get("image_grid_thw")
            keys[colour] = image_digest(model, pre.pixel_values, grid)
            again = image_digest(model, np.array(pre.pixel_values), grid)
            assert again == keys[colour]  # the same pixels: the same key
            assert image_digest("another-model", pre.pixel_values, grid) != keys[colour]
        assert keys["red"] != keys["blue"]
