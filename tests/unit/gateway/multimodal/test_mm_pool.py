"""The image pool (--mm-workers): real pool processes forked from a real forkserver.

Results must be the in-process processing's bit for bit; a pool process that dies fails only
the images it held, then the pool serves again; a cancelled request leaves no pixel segment
in /dev/shm and gives its budget back once the pool is done with its images.
"""

from __future__ import annotations

import asyncio
import io
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from mm_gateway_models import Model
from mm_gateway_origin import data_url, png_bytes
from PIL import Image

from tandem.errors import TandemError
from tandem.gateway import metrics
from tandem.gateway.multimodal import ProcessedImages, plan_images, process_images
from tandem.gateway.multimodal.pixel_segments import PREFIX, segment_dir
from tandem.gateway.multimodal.pool import ImagePool
from tandem.media import MediaPolicy
from tandem.media.budget import ByteBudget


def jpeg_bytes(size: tuple[int, int], seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=90)
    return out.getvalue()


# Sizes that give Qwen different grids; a JPEG beside the PNGs.
IMAGES = [
    data_url(png_bytes((40, 30), seed=1)),
    data_url(jpeg_bytes((96, 64), seed=2), "image/jpeg"),
    data_url(png_bytes((64, 96), seed=3)),
]
# Noise decodes and resizes slowly enough (~0.1 s a piece) to be caught mid-way.
BIG = data_url(png_bytes((1600, 1600), seed=9))


def segments() -> set[str]:
    return {name for name in os.listdir(segment_dir()) if name.startswith(PREFIX)}


async def until_busy(pool: ImagePool) -> None:
    """Until the pool has images of the request (its headers and hashes come first)."""
    deadline = time.monotonic() + 30
    while not any(slot.busy for slot in pool._slots):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.005)
    await asyncio.sleep(0.02)  # the first one is running


@pytest.fixture
async def pool() -> AsyncIterator[ImagePool]:
    started = ImagePool(2)
    await started.start()
    try:
        yield started
    finally:
        await started.stop()


async def run(
    model: Model, urls: list[str], pool: ImagePool | None, budget: ByteBudget | None = None
) -> ProcessedImages:
    lease = budget.lease() if budget is not None else None
    try:
        return await process_images(
            plan_images(urls), model.info, model.processor, MediaPolicy(), lease=lease, pool=pool
        )
    finally:
        if lease is not None:
            lease.release()


def assert_same(a: ProcessedImages, b: ProcessedImages) -> None:
    assert a.pixel_values is not None and b.pixel_values is not None
    assert a.pixel_values.dtype == b.pixel_values.dtype
    assert a.pixel_values.shape == b.pixel_values.shape
    assert a.pixel_values.tobytes() == b.pixel_values.tobytes()
    assert a.tokens_per_image == b.tokens_per_image
    assert a.grids.keys() == b.grids.keys()
    for key in a.grids:
        np.testing.assert_array_equal(a.grids[key], b.grids[key])
    if a.patches_per_image is None:
        assert b.patches_per_image is None
    else:
        np.testing.assert_array_equal(a.patches_per_image, b.patches_per_image)
    assert a.hashes == b.hashes
    assert a.normalize_lut is not None and b.normalize_lut is not None
    assert a.normalize_lut.tobytes() == b.normalize_lut.tobytes()


async def test_pool_results_are_the_in_process_bits(model: Model, pool: ImagePool) -> None:
    before = segments()
    in_process = await run(model, IMAGES, None)
    for urls in (IMAGES, IMAGES[1:2]):
        pooled = await run(model, urls, pool)
        reference = in_process if len(urls) == 3 else await run(model, urls, None)
        assert_same(pooled, reference)
    assert segments() == before


async def test_pool_charges_the_budget_as_in_process(model: Model, pool: ImagePool) -> None:
    """Once processed, the lease holds the pixel bytes; every byte is back afterwards."""
    budget = ByteBudget(1 << 30)
    lease = budget.lease()
    processed = await process_images(
        plan_images(IMAGES), model.info, model.processor, MediaPolicy(), lease=lease, pool=pool
    )
    assert processed.pixel_values is not None
    assert lease.nbytes == processed.pixel_values.nbytes
    await asyncio.sleep(0.05)  # the per-image decode shares come back via the loop
    assert budget.used == lease.nbytes
    lease.release()
    assert budget.used == 0


async def test_pool_processes_are_torch_free(pool: ImagePool) -> None:
    assert pool.torch_loaded() == [False, False]


def niceness(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


async def test_pool_processes_run_below_the_event_loop(qwen: Model) -> None:
    """--mm-workers-nice: the processes' niceness is the gateway's plus the flag's."""
    for nice in (0, 7):
        pool = ImagePool(1, nice)
        await pool.start()
        try:
            await run(qwen, IMAGES[:1], pool)
            (pid,) = pool.pids()
            assert niceness(pid) == min(19, niceness(os.getpid()) + nice)
        finally:
            await pool.stop()


async def test_a_refused_image_is_the_same_400_as_in_process(qwen: Model, pool: ImagePool) -> None:
    broken = data_url(png_bytes((40, 30), seed=1)[:60])
    errors = []
    for which in (None, pool):
        with pytest.raises(TandemError) as info:
            await run(qwen, [IMAGES[0], broken], which)
        errors.append((info.value.status, info.value.code))
    assert errors[0] == errors[1] == (400, "multimodal_processing_failed")


async def test_a_killed_pool_process_fails_its_images_then_the_pool_recovers(
    qwen: Model,
) -> None:
    pool = ImagePool(1)
    await pool.start()
    try:
        before = segments()
        restarts = metrics.MM_POOL_RESTARTS._value.get()
        (pid,) = pool.pids()
        work = asyncio.ensure_future(run(qwen, [BIG, BIG, BIG], pool))
        await until_busy(pool)  # queued and running in the one process
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(TandemError) as info:
            await work
        assert (info.value.status, info.value.code) == (500, "multimodal_pool_process_died")
        assert metrics.MM_POOL_RESTARTS._value.get() == restarts + 1
        # The replacement serves the next request, bit for bit.
        assert_same(await run(qwen, IMAGES, pool), await run(qwen, IMAGES, None))
        assert pool.pids() and pool.pids() != [pid]
        # A process killed while idle costs no request anything.
        (idle,) = pool.pids()
        os.kill(idle, signal.SIGKILL)
        await asyncio.sleep(0.3)  # the loop notices the death (the process's sentinel)
        await run(qwen, IMAGES[:1], pool)
        assert segments() == before
    finally:
        await pool.stop()


async def test_a_cancelled_request_leaves_no_segment_and_no_budget(
    qwen: Model, pool: ImagePool
) -> None:
    before = segments()
    budget = ByteBudget(1 << 30)
    work = asyncio.ensure_future(run(qwen, [BIG, BIG, BIG, BIG], pool, budget))
    await until_busy(pool)  # two running, two queued
    assert budget.used > 0
    work.cancel()
    with pytest.raises(asyncio.CancelledError):
        await work
    deadline = time.monotonic() + 30
    while any(slot.busy for slot in pool._slots) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.05)
    assert not any(slot.busy for slot in pool._slots)
    assert segments() == before
    assert budget.used == 0
