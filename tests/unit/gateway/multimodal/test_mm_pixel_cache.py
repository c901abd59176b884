"""The per-image pixel cache (--mm-pixel-cache-mb): LRU by bytes, read-only entries, a key
that never crosses models or images, and hits that are bit-identical to misses."""

from __future__ import annotations

import numpy as np
import pytest
from mm_gateway_models import Model
from mm_gateway_origin import data_url, png_bytes

from tandem.gateway import metrics
from tandem.gateway.multimodal import ProcessedImages, plan_images, process_images
from tandem.gateway.multimodal.pixel_cache import OneImage, PixelCache
from tandem.gateway.multimodal.pool import ImagePool
from tandem.gateway.multimodal.pool_spec import processor_spec
from tandem.media import MediaPolicy, media_hash
from tandem.media.budget import ByteBudget

A, B = png_bytes((40, 30), seed=1), png_bytes((96, 64), seed=2)
# Same size as A, other pixels: must never share A's entry.
A_TWIN = png_bytes((40, 30), seed=5)


def entry(nbytes: int, value: int = 0) -> OneImage:
    return OneImage(np.full(nbytes, value, np.uint8), 1, {}, None, None)


def hits() -> float:
    return metrics.MM_PIXEL_CACHE_HITS._value.get()


def misses() -> float:
    return metrics.MM_PIXEL_CACHE_MISSES._value.get()


def test_lru_by_bytes() -> None:
    cache = PixelCache(250)
    for name in "abc":
        cache.put((name, "f"), entry(100))
    assert len(cache) == 2 and cache.nbytes == 200  # "a" went to make room for "c"
    assert cache.get(("a", "f")) is None
    assert cache.get(("b", "f")) is not None  # now the most recent
    cache.put(("d", "f"), entry(100))
    assert cache.get(("c", "f")) is None and cache.get(("b", "f")) is not None
    cache.put(("huge", "f"), entry(251))  # larger than the whole cache: not kept
    assert cache.get(("huge", "f")) is None and cache.nbytes == 200
    assert metrics.MM_PIXEL_CACHE_BYTES._value.get() == 200


def test_off_when_zero() -> None:
    cache = PixelCache(0)
    cache.put(("a", "f"), entry(10))
    assert len(cache) == 0 and cache.get(("a", "f")) is None


def test_entries_are_read_only() -> None:
    cache = PixelCache(1 << 20)
    image = OneImage(
        np.zeros((2, 3), np.uint8),
        4,
        {"image_grid_thw": np.array([[1, 2, 2]])},
        np.array([4]),
        np.zeros((3, 256), np.float32),
    )
    cache.put(("a", "f"), image)
    got = cache.get(("a", "f"))
    assert got is not None
    for array in (got.pixels, got.grids["image_grid_thw"], got.patches, got.lut):
        assert array is not None
        with pytest.raises(ValueError, match="read-only"):
            array[...] = 1


def test_fingerprint_differs_by_model_and_output(qwen: Model, llava: Model) -> None:
    policy = MediaPolicy()
    q = processor_spec(qwen.processor, qwen.info, policy, raw=True)
    assert q == processor_spec(qwen.processor, qwen.info, policy, raw=True)
    assert (
        q.fingerprint != processor_spec(llava.processor, llava.info, policy, raw=True).fingerprint
    )
    assert q.fingerprint != processor_spec(qwen.processor, qwen.info, policy, raw=False).fingerprint
    drafted = MediaPolicy(jpeg_draft=True)
    assert q.fingerprint != processor_spec(qwen.processor, qwen.info, drafted, raw=True).fingerprint


async def run(
    model: Model,
    blobs: list[bytes],
    cache: PixelCache | None,
    pool: ImagePool | None = None,
    budget: ByteBudget | None = None,
) -> ProcessedImages:
    lease = budget.lease() if budget is not None else None
    try:
        return await process_images(
            plan_images([data_url(b) for b in blobs]),
            model.info,
            model.processor,
            MediaPolicy(),
            lease=lease,
            pool=pool,
            cache=cache,
        )
    finally:
        if lease is not None:
            lease.release()


def assert_same(a: ProcessedImages, b: ProcessedImages) -> None:
    assert a.pixel_values is not None and b.pixel_values is not None
    assert (a.pixel_values.dtype, a.pixel_values.shape) == (
        b.pixel_values.dtype,
        b.pixel_values.shape,
    )
    assert a.pixel_values.tobytes() == b.pixel_values.tobytes()
    assert a.tokens_per_image == b.tokens_per_image
    for key in a.grids.keys() | b.grids.keys():
        np.testing.assert_array_equal(a.grids[key], b.grids[key])
    assert (a.patches_per_image is None) == (b.patches_per_image is None)
    if a.patches_per_image is not None:
        np.testing.assert_array_equal(a.patches_per_image, b.patches_per_image)
    assert a.hashes == b.hashes


@pytest.mark.parametrize("pooled", [False, True], ids=["thread", "pool"])
async def test_a_hit_gives_the_bits_of_a_miss(model: Model, pooled: bool) -> None:
    pool = ImagePool(2) if pooled else None
    if pool is not None:
        await pool.start()
    try:
        cache = PixelCache(64 << 20)
        uncached = await run(model, [A, B], None, pool)
        h, m = hits(), misses()
        first = await run(model, [A, B], cache, pool)
        assert (hits() - h, misses() - m) == (0, 2)
        assert_same(first, uncached)
        # Per image: a later turn re-sends A beside a new image, and A alone.
        budget = ByteBudget(1 << 30)
        again = await run(model, [B, A_TWIN, A], cache, pool, budget)
        assert (hits() - h, misses() - m) == (2, 3)
        assert_same(again, await run(model, [B, A_TWIN, A], None, pool))
        alone = await run(model, [A], cache, pool)
        assert (hits() - h, misses() - m) == (3, 3)
        assert_same(alone, await run(model, [A], None, pool))
        assert budget.used == 0
        # The batch of several images is built by copying: it never aliases an entry.
        assert again.pixel_values is not None and again.pixel_values.flags.writeable
        for image in cache._entries.values():
            assert not np.shares_memory(again.pixel_values, image.pixels)
        assert len(cache) == 3  # A, B and A's same-size twin, each its own entry
        assert cache.nbytes == sum(e.nbytes for e in cache._entries.values())
    finally:
        if pool is not None:
            await pool.stop()


async def test_same_size_images_never_share_an_entry(qwen: Model) -> None:
    cache = PixelCache(64 << 20)
    a = await run(qwen, [A], cache)
    twin = await run(qwen, [A_TWIN], cache)
    assert a.pixel_values is not None and twin.pixel_values is not None
    assert a.pixel_values.shape == twin.pixel_values.shape
    assert a.pixel_values.tobytes() != twin.pixel_values.tobytes()
    fingerprint = processor_spec(qwen.processor, qwen.info, MediaPolicy(), raw=True).fingerprint
    assert set(cache._entries) == {(media_hash(A), fingerprint), (media_hash(A_TWIN), fingerprint)}


async def test_the_cache_never_crosses_models(qwen: Model, llava: Model) -> None:
    cache = PixelCache(64 << 20)
    await run(qwen, [A], cache)
    h, m = hits(), misses()
    from_llava = await run(llava, [A], cache)
    assert (hits() - h, misses() - m) == (0, 1)
    assert_same(from_llava, await run(llava, [A], None))
    assert len(cache) == 2
