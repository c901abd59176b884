"""Retention shared by the backends: the TTL cut-off and the periodic sweeper task.

What is kept and for how long is in docs/operations.md, "Stored responses (history
backends)": rows older than ``ttl_s`` go, then the oldest rows while all rows together are
over ``max_total_bytes``. Each backend does the deleting (``ResponseStore.sweep``); this
module only decides when.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable

from tandem.gateway.history.store import HistoryError, HistoryLimits, ResponseTooLarge

log = logging.getLogger("tandem.gateway.history")


def expiry_cutoff(limits: HistoryLimits, now: float) -> float:
    """Rows created before this instant are expired (-inf: nothing expires)."""
    return now - limits.ttl_s if limits.ttl_s else -math.inf


def check_size(size: int, limits: HistoryLimits) -> None:
    """Refuse one row over ``max_response_bytes`` before anything is written."""
    if size > limits.max_response_bytes:
        raise ResponseTooLarge(size, limits.max_response_bytes)


class Sweeper:
    """Runs ``sweep`` every ``interval_s`` until stopped; a failed sweep is logged, not fatal.

    The first sweep runs in :meth:`start` itself (retention applies from the first request
    on, and a store that cannot sweep fails the gateway's start instead of warning later).
    """

    def __init__(self, sweep: Callable[[], Awaitable[int]], interval_s: float, name: str) -> None:
        self._sweep = sweep
        self._interval_s = interval_s
        self._name = name
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._once(at_start=True)
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name=f"history-sweeper-{self._name}")

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self._once(at_start=False)
            except HistoryError as err:  # the database may be back at the next sweep
                log.warning("history %s: retention sweep failed: %s", self._name, err)

    async def _once(self, at_start: bool) -> None:
        deleted = await self._sweep()
        if deleted:
            when = "at start" if at_start else "by retention"
            log.info("history %s: %d stored responses deleted %s", self._name, deleted, when)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
