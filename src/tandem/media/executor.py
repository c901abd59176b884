"""The threads that decode media: one small bounded pool, apart from asyncio's default one.

Video decode, image decode and preprocess, container headers, hashes and batch joins are
CPU work of unbounded length (a clip can take seconds). On asyncio's default executor they
would queue in front of what the rest of the process needs promptly there: every media
URL's DNS look-up (``loop.getaddrinfo``). So media work runs here, and only here: at most
:func:`media_threads` threads, further calls queue (no more threads start), and the default
executor stays free for DNS however many videos are being decoded (``tandem/threadpools.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from tandem.threadpools import BoundedPool, usable_cpus

T = TypeVar("T")

THREAD_PREFIX = "tandem-media"
# Enough to keep a few requests' media moving at once, few enough that decoding never
# takes every core from the event loop, the image pool and tokenization.
_MAX_THREADS = 4


def media_threads() -> int:
    """Threads of the media pool: the CPUs this process may use, 1 to 4."""
    return max(1, min(_MAX_THREADS, usable_cpus()))


# Below the event loop's priority, for the same reason as the tokenizing pool's: where the
# threads share a core with the loop, streams go first (``tandem/threadpools.py``).
MEDIA_NICE = 10
_MEDIA = BoundedPool(THREAD_PREFIX, media_threads, nice=MEDIA_NICE)


def media_executor() -> ThreadPoolExecutor:
    """The process's media pool, made on first use."""
    return _MEDIA.executor()


async def run_media(func: Callable[..., T], *args: object) -> T:
    """``func(*args)`` on the media pool, as ``asyncio.to_thread`` would on the default one.

    The caller's context variables go along (as with ``to_thread``). A caller cancelled
    while its call still queues takes it out of the queue; one already running goes on.
    """
    return await _MEDIA.run(func, *args)
