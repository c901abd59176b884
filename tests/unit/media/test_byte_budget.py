"""The byte budget behind the gateway's and the worker's decoded-image limits."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tandem.media.budget import BudgetExceeded, ByteBudget, run_in_thread_holding


def test_a_lease_grows_shrinks_and_is_released_once() -> None:
    budget = ByteBudget(1000)
    lease = budget.lease()
    assert budget.used == 0 and lease.nbytes == 0
    lease.hold(700)
    assert budget.used == 700
    lease.hold(100)  # shrinking always succeeds
    assert budget.used == 100
    lease.release()
    lease.release()
    assert budget.used == 0 and lease.released
    with pytest.raises(RuntimeError):
        lease.hold(1)


def test_growing_is_refused_now_or_ever() -> None:
    budget = ByteBudget(1000)
    held = budget.acquire(600)
    other = budget.lease()
    with pytest.raises(BudgetExceeded) as now:
        other.hold(500)
    assert not now.value.ever and budget.used == 600
    with pytest.raises(BudgetExceeded) as ever:
        other.hold(1001)
    assert ever.value.ever and budget.used == 600
    other.hold(400)  # exactly full is allowed
    assert budget.used == 1000
    held.release()
    other.release()
    assert budget.used == 0


def test_split_moves_bytes_into_a_lease_of_their_own() -> None:
    budget = ByteBudget(1000)
    lease = budget.acquire(900)
    part = lease.split(600)
    assert (lease.nbytes, part.nbytes, budget.used) == (300, 600, 900)
    part.release()
    assert budget.used == 300
    with pytest.raises(ValueError):
        lease.split(301)
    lease.release()
    assert budget.used == 0


def test_zero_means_no_limit() -> None:
    budget = ByteBudget(0)
    budget.acquire(1 << 40).release()
    assert budget.used == 0


async def test_a_cancelled_caller_keeps_the_charge_until_the_thread_is_done() -> None:
    """The thread cannot be stopped, so its bytes stay charged until it really ends."""
    budget = ByteBudget(1000)
    lease = budget.acquire(800)
    started, finish = threading.Event(), threading.Event()

    def decode() -> str:
        started.set()
        finish.wait(10)
        return "pixels"

    caller = asyncio.ensure_future(run_in_thread_holding(lease, decode))
    await asyncio.to_thread(started.wait, 10)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert budget.used == 800  # still decoding
    finish.set()
    for _ in range(500):
        if not budget.used:
            break
        await asyncio.sleep(0.01)
    assert budget.used == 0


async def test_the_charge_ends_with_the_thread_on_success_and_failure() -> None:
    budget = ByteBudget(1000)
    assert await run_in_thread_holding(budget.acquire(10), lambda: 42) == 42
    assert budget.used == 0

    def broken() -> None:
        raise ValueError("bad image")

    with pytest.raises(ValueError, match="bad image"):
        await run_in_thread_holding(budget.acquire(10), broken)
    assert budget.used == 0
