"""The bounded pools' threads run at the niceness asked for, and the caller's is untouched."""

from __future__ import annotations

import asyncio
import os
import threading

from tandem.threadpools import BoundedPool, lower_thread_priority


def _own_niceness() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def test_a_pool_thread_runs_below_the_caller() -> None:
    before = _own_niceness()
    pool = BoundedPool("test-nice", lambda: 1, nice=3)
    try:
        inside = asyncio.run(pool.run(_own_niceness))
    finally:
        pool.executor().shutdown()
    assert inside == min(19, before + 3)
    assert _own_niceness() == before  # only the pool's thread moved


def test_a_pool_without_nice_keeps_the_callers_priority() -> None:
    before = _own_niceness()
    pool = BoundedPool("test-plain", lambda: 1)
    try:
        assert asyncio.run(pool.run(_own_niceness)) == before
    finally:
        pool.executor().shutdown()


def test_lowering_never_passes_19() -> None:
    def lowered_twice() -> int:
        lower_thread_priority(15)
        lower_thread_priority(15)
        return _own_niceness()

    worker = BoundedPool("test-cap", lambda: 1)
    try:
        assert asyncio.run(worker.run(lowered_twice)) == 19
    finally:
        worker.executor().shutdown()
