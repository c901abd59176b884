"""Admission control: how many generation requests run, wait, and hold pixel bytes at once.

Two independent bounds keep the gateway's memory flat under overload:

- :class:`AdmissionQueue`: at most ``max_concurrent`` generation requests run (read their
  body, preprocess media, talk to workers); up to ``max_queued`` more wait, in arrival
  order, for a slot. Beyond that a request is refused at once with 429
  ``too_many_requests``: a queue that grows without end only turns overload into
  timeouts and memory.
- :class:`PixelBudget`: the image bytes held by in-flight requests: while their images are
  decoded and preprocessed (charged from the image headers, before decoding), then their
  pixel tensors until the pixels have gone to a worker (docs/operations.md, "Memory bounds
  for images"). Over the budget → 429 ``multimodal_inflight_budget``; a single request
  above the whole budget could never pass → 413 ``multimodal_payload_too_large``.

Everything runs on the gateway's one event loop, so plain integers suffice. Both hand
out leases whose ``release`` is idempotent, so every exit path may call it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque

from tandem.errors import TandemError, make_error
from tandem.gateway import metrics
from tandem.media.budget import ByteBudget, ByteLease

# Seconds a refused client is told to wait. Requests on these workers take from
# milliseconds to seconds; one second spreads retries without idling capacity long.
RETRY_AFTER_S = 1


def rejected(code: str, message: str, reason: str) -> TandemError:
    """A refusal, counted under ``reason``; 429s carry ``Retry-After``."""
    metrics.ADMISSION_REJECTED.labels(reason).inc()
    err = make_error(code, message)
    if err.status in (429, 503):
        err.retry_after = RETRY_AFTER_S
    return err


class Slot:
    """One admitted request; ``release`` hands the slot to the next waiter (once)."""

    __slots__ = ("_queue", "_released")

    def __init__(self, queue: AdmissionQueue) -> None:
        self._queue = queue
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._queue._release()


class AdmissionQueue:
    """A bounded FIFO in front of the pipeline. ``max_concurrent=0`` turns it off."""

    def __init__(self, max_concurrent: int, max_queued: int) -> None:
        if max_concurrent < 0 or max_queued < 0:
            raise ValueError("max_concurrent and max_queued must be >= 0")
        self.max_concurrent = max_concurrent
        self.max_queued = max_queued
        self.running = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def queued(self) -> int:
        return len(self._waiters)

    async def acquire(self, timeout_s: float) -> Slot:
        """A slot now, or after waiting in line at most ``timeout_s`` (then 504)."""
        if not self.max_concurrent or (self.running < self.max_concurrent and not self._waiters):
            return self._admit()
        if len(self._waiters) >= self.max_queued:
            raise rejected(
                "too_many_requests",
                f"the gateway is at --max-concurrent-requests={self.max_concurrent} with "
                f"--max-queued-requests={self.max_queued} waiting; retry later",
                "queue_full",
            )
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self._publish()
        try:
            async with asyncio.timeout(timeout_s):
                await waiter
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled():
                # Handed a slot just as we gave up: pass it on rather than lose it.
                self.running -= 1
                self._wake()
            else:
                waiter.cancel()
                self._drop(waiter)
            self._publish()
            if isinstance(exc, TimeoutError):
                raise rejected(
                    "request_timeout",
                    f"waited --request-timeout-secs={timeout_s} for an admission slot",
                    "queue_timeout",
                ) from None
            raise
        self._publish()
        return Slot(self)  # ``_wake`` already counted it as running

    def _admit(self) -> Slot:
        self.running += 1
        self._publish()
        return Slot(self)

    def _release(self) -> None:
        self.running -= 1
        self._wake()
        self._publish()

    def _wake(self) -> None:
        """Give free slots to the oldest live waiters (counting them as running)."""
        while self._waiters and (not self.max_concurrent or self.running < self.max_concurrent):
            waiter = self._waiters.popleft()
            if waiter.done():
                continue  # cancelled while waiting
            self.running += 1
            waiter.set_result(None)

    def _drop(self, waiter: asyncio.Future[None]) -> None:
        with contextlib.suppress(ValueError):
            self._waiters.remove(waiter)

    def _publish(self) -> None:
        metrics.REQUESTS_RUNNING.set(self.running)
        metrics.REQUESTS_QUEUED.set(len(self._waiters))


# A request's share of the PixelBudget (see tandem.media.budget).
PixelLease = ByteLease


class PixelBudget(ByteBudget):
    """Process-wide cap on in-flight image bytes. ``limit=0`` turns it off."""

    def refuse(self, nbytes: int, *, ever: bool) -> Exception:
        if ever:
            return rejected(
                "multimodal_payload_too_large",
                f"the request's images take {nbytes} bytes while decoded (one at a time) and "
                f"preprocessed, more than --multimodal-max-inflight-bytes={self.limit}; send "
                "fewer or smaller images",
                "mm_too_large",
            )
        return rejected(
            "multimodal_inflight_budget",
            f"in-flight image data is at --multimodal-max-inflight-bytes={self.limit}; retry later",
            "mm_inflight_bytes",
        )

    def changed(self) -> None:
        metrics.MM_INFLIGHT_BYTES.set(self.used)
