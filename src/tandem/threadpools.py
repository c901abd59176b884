"""Bounded thread pools of their own, apart from asyncio's default executor.

Some CPU work of unbounded length must leave the event loop: media decoding
(``media/executor.py``) and long tokenization (``gateway/tokenizing.py``). On the default
executor such work would queue in front of what the process needs promptly there (every
media URL's DNS look-up), and any number of threads could run it at once, taking every core
from the event loop. A :class:`BoundedPool` runs one kind of work: at most its size in
threads, further calls queue (no more threads start), and a caller cancelled while its call
still queues takes it out of the queue.

A pool may run at a lower CPU priority (``nice``): on Linux each thread is a task of its own
with its own niceness, so where the pool's threads and the event loop want the same cores
the loop goes first and the pool takes the rest. The batch tokenizers release the GIL while
they work, so the loop can run beside them; it only has to win the CPU too (two cores shared
by a loop and a 2 MiB encode left inter-token gaps of 50–60 ms at equal priority).

A pool is made on first use and dropped in a forked child (its threads do not exist there),
so importing a module that declares one starts nothing.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

_pools: weakref.WeakSet[BoundedPool] = weakref.WeakSet()


def usable_cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def lower_thread_priority(increment: int) -> None:
    """Add ``increment`` to the calling thread's niceness (Linux: per thread; elsewhere,
    where a thread has no niceness of its own, nothing). Lowering one's own priority needs
    no privilege; a failure leaves the thread as it was."""
    if increment <= 0 or not hasattr(os, "setpriority"):
        return
    try:
        tid = threading.get_native_id()
        current = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, current + increment))
    except OSError:
        pass


class BoundedPool:
    def __init__(self, prefix: str, size: Callable[[], int], nice: int = 0) -> None:
        self.prefix = prefix
        self.nice = nice  # added to each thread's niceness as it starts
        self._size = size  # read when the pool is made, so tests and forks see the machine
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        _pools.add(self)

    @property
    def threads(self) -> int:
        return max(1, self._size())

    def executor(self) -> ThreadPoolExecutor:
        """The pool's executor, made on first use."""
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    max_workers=self.threads,
                    thread_name_prefix=self.prefix,
                    initializer=lower_thread_priority,
                    initargs=(self.nice,),
                )
            return self._executor

    async def run(self, func: Callable[..., T], *args: object) -> T:
        """``func(*args)`` on this pool, as ``asyncio.to_thread`` would on the default one
        (the caller's context variables go along)."""
        loop = asyncio.get_running_loop()
        call = functools.partial(contextvars.copy_context().run, func, *args)
        return await loop.run_in_executor(self.executor(), call)

    def _forget(self) -> None:
        self._lock, self._executor = threading.Lock(), None


def _forget_all() -> None:
    for pool in list(_pools):
        pool._forget()


os.register_at_fork(after_in_child=_forget_all)
