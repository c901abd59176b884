"""A byte budget that concurrent requests charge before they decode images.

The gateway (``--multimodal-max-inflight-bytes``) and the worker (``--mm-max-decoded-bytes``)
each keep one. A request charges what its images will take *before* a pixel is decoded
(docs/operations.md, "Memory bounds for images"), then shrinks its lease to what it still
holds. Subclasses decide what a refusal looks like (an HTTP error on the gateway, a gRPC
status on the worker) and what to publish when the total changes.

Everything is called from one event loop, so plain integers suffice; leases are released
idempotently, so every exit path may release.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable
from typing import TypeVar

from tandem.media.executor import media_executor

T = TypeVar("T")


class BudgetExceeded(Exception):
    """The default refusal; ``ever`` is False when the charge could fit on an idle budget."""

    def __init__(self, message: str, *, ever: bool) -> None:
        super().__init__(message)
        self.ever = ever


class ByteLease:
    """Bytes held against a :class:`ByteBudget`; resizable, released once."""

    __slots__ = ("_budget", "nbytes")

    def __init__(self, budget: ByteBudget, nbytes: int = 0) -> None:
        self._budget: ByteBudget | None = budget
        self.nbytes = nbytes

    @property
    def released(self) -> bool:
        return self._budget is None

    def hold(self, nbytes: int) -> None:
        """Hold exactly ``nbytes`` from now on; growing may be refused, shrinking never is."""
        budget = self._budget
        if budget is None:
            raise RuntimeError("this lease was already released")
        if nbytes < 0:
            raise ValueError("a lease cannot hold a negative number of bytes")
        if nbytes > self.nbytes:
            budget._check(nbytes, nbytes - self.nbytes)
        budget.used += nbytes - self.nbytes
        self.nbytes = nbytes
        budget.changed()

    def split(self, nbytes: int) -> ByteLease:
        """Move ``nbytes`` of this lease into a new one, released on its own."""
        budget = self._budget
        if budget is None:
            raise RuntimeError("this lease was already released")
        if not 0 <= nbytes <= self.nbytes:
            raise ValueError(f"cannot split {nbytes} bytes off a lease of {self.nbytes}")
        self.nbytes -= nbytes
        return ByteLease(budget, nbytes)

    def release(self) -> None:
        budget, self._budget = self._budget, None
        if budget is not None:
            budget.used -= self.nbytes
            budget.changed()


class ByteBudget:
    """A cap on bytes held by every lease together. ``limit=0`` turns it off."""

    def __init__(self, limit: int) -> None:
        if limit < 0:
            raise ValueError("limit must be >= 0")
        self.limit = limit
        self.used = 0

    def lease(self) -> ByteLease:
        """An empty lease, for a request that will charge it later."""
        return ByteLease(self)

    def acquire(self, nbytes: int) -> ByteLease:
        """A lease of ``nbytes`` or the refusal of :meth:`refuse`."""
        lease = self.lease()
        lease.hold(nbytes)
        return lease

    def _check(self, total: int, extra: int) -> None:
        if not self.limit:
            return
        if total > self.limit:
            raise self.refuse(total, ever=True)
        if self.used + extra > self.limit:
            raise self.refuse(total, ever=False)

    def refuse(self, nbytes: int, *, ever: bool) -> Exception:
        """The error for a lease of ``nbytes`` that does not fit (``ever``: not even idle)."""
        if ever:
            return BudgetExceeded(
                f"{nbytes} bytes are over the {self.limit}-byte budget", ever=True
            )
        return BudgetExceeded(
            f"{nbytes} bytes do not fit: {self.used} of {self.limit} are in use", ever=False
        )

    def changed(self) -> None:
        """Called after every change of ``used`` (e.g. to publish a gauge)."""


async def run_in_thread_holding(
    lease: ByteLease | None, func: Callable[[], T], *, cancel: threading.Event | None = None
) -> T:
    """``func()`` on the media pool (media/executor.py); ``lease`` is released when it ends.

    A thread cannot be stopped from outside: if the caller is cancelled (a timeout, a client
    gone), ``cancel`` is set, for a ``func`` that checks it between steps (video decode
    does, between frames) to return early; until the thread has really ended its memory is
    in use, so its bytes stay charged. A call still queued for a pool thread never starts.
    """
    loop = asyncio.get_running_loop()
    call = contextvars.copy_context().run
    submitted = media_executor().submit(call, func)
    # Never cancelled itself: it is done only when the thread is (or the call never ran).
    work = asyncio.wrap_future(submitted, loop=loop)

    def finished(task: asyncio.Future[T]) -> None:
        if lease is not None:
            lease.release()
        if not task.cancelled():
            task.exception()  # retrieved here, so an abandoned failure is not logged as lost

    work.add_done_callback(finished)
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        if cancel is not None:
            cancel.set()
        submitted.cancel()  # only takes effect while the call is still queued
        raise
