"""Media work has its own bounded pool, so it cannot starve DNS look-ups or tokenization
(both on asyncio's default executor) however many videos are being decoded."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from tandem.media.budget import ByteBudget, run_in_thread_holding
from tandem.media.executor import THREAD_PREFIX, media_threads, run_media


def _media_threads_alive() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX))


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """Set at the end of every test, so that no pool thread stays blocked after it."""
    gate = threading.Event()
    yield gate
    gate.set()


def test_the_pool_is_small() -> None:
    assert 1 <= media_threads() <= 4


async def test_media_work_runs_on_the_media_pool() -> None:
    assert (await run_media(lambda: threading.current_thread().name)).startswith(THREAD_PREFIX)
    name = await run_in_thread_holding(None, lambda: threading.current_thread().name)
    assert name.startswith(THREAD_PREFIX)
    # What stays on asyncio's default executor is not in the media pool.
    default = await asyncio.to_thread(lambda: threading.current_thread().name)
    assert not default.startswith(THREAD_PREFIX)


async def test_a_saturated_media_pool_leaves_dns_and_tokenization_free(
    release: threading.Event,
) -> None:
    size = media_threads()
    running = threading.Semaphore(0)
    started: list[int] = []

    def blocked(n: int) -> int:
        started.append(n)
        running.release()
        release.wait(10)
        return n

    calls = [asyncio.ensure_future(run_media(blocked, n)) for n in range(size + 2)]
    for _ in range(size):
        assert await asyncio.to_thread(running.acquire, True, 10)
    # Every media thread is busy: the rest queue, and no further thread starts.
    await asyncio.sleep(0.05)
    assert len(started) == size and _media_threads_alive() <= size
    # A DNS look-up (the event loop's getaddrinfo) and a to_thread call (tokenization) run.
    infos = await asyncio.wait_for(asyncio.get_running_loop().getaddrinfo("127.0.0.1", 80), 5)
    assert infos
    assert await asyncio.wait_for(asyncio.to_thread(lambda: "tokens"), 5) == "tokens"
    release.set()
    assert await asyncio.gather(*calls) == list(range(size + 2))


async def test_a_queued_call_whose_caller_is_cancelled_never_runs(
    release: threading.Event,
) -> None:
    size = media_threads()
    running = threading.Semaphore(0)

    def blocked() -> None:
        running.release()
        release.wait(10)

    busy = [asyncio.ensure_future(run_media(blocked)) for _ in range(size)]
    for _ in range(size):
        assert await asyncio.to_thread(running.acquire, True, 10)
    budget = ByteBudget(100)
    ran = threading.Event()
    cancel = threading.Event()
    queued = asyncio.ensure_future(
        run_in_thread_holding(budget.acquire(60), ran.set, cancel=cancel)
    )
    await asyncio.sleep(0.05)
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    assert cancel.is_set()
    for _ in range(100):  # taken out of the queue: its charge ends without a thread
        if not budget.used:
            break
        await asyncio.sleep(0.01)
    assert budget.used == 0
    release.set()
    await asyncio.gather(*busy)
    await run_media(lambda: None)  # the pool has moved past where the call was queued
    assert not ran.is_set()
