"""The worker's grammar compile pool: bounded, and it counts compiles that overran.

The compile function is a stand-in that blocks on an event (a real xgrammar compile that
runs for minutes cannot be made on demand); the pool, its threads and its asyncio
plumbing are the real ones.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from tandem.worker.output_plan import CompilePool, CompilerSaturated


async def test_overrun_compiles_hold_their_threads_and_then_saturate() -> None:
    pool = CompilePool(threads=2)
    release = threading.Event()
    names: list[str] = []

    def stuck() -> str:
        names.append(threading.current_thread().name)
        release.wait(10)
        return "late"

    for _ in range(2):
        with pytest.raises(TimeoutError):
            await pool.run(stuck, timeout=0.05)
    assert pool.overrun == 2 and all(n.startswith("grammar-compile") for n in names)
    with pytest.raises(CompilerSaturated, match="worker is saturated"):
        await pool.run(lambda: "never", timeout=1)  # refused at once, not queued
    release.set()
    for _ in range(100):
        if pool.overrun == 0:
            break
        await asyncio.sleep(0.02)
    assert pool.overrun == 0  # the overrun compiles ended: their threads are free again
    assert await pool.run(lambda: "fast", timeout=1) == "fast"


async def test_a_compile_that_fails_is_its_error_and_holds_nothing() -> None:
    pool = CompilePool(threads=1)

    def bad() -> None:
        raise ValueError("not a grammar")

    with pytest.raises(ValueError, match="not a grammar"):
        await pool.run(bad, timeout=1)
    assert pool.overrun == 0
    assert await pool.run(lambda x: x * 2, 21, timeout=1) == 42
