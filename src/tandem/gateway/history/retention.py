"""Retention shared by the backends: the TTL cut-off and the periodic sweeper task.

What is kept and for how long is in docs/operations.md, "Stored responses (history
backends)": rows older than ``ttl_s`` go, then each tenant's oldest rows while that tenant's
are over its cap, then the oldest rows while all rows together are over
``max_total_bytes``. Each backend does the deleting (``ResponseStore.sweep``, and the
memory backend's ``put``); this module decides when, and how large one row may be.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable

from tandem.gateway.history.store import (
    ConversationTooLarge,
    HistoryError,
    HistoryLimits,
    ResponseTooLarge,
)

log = logging.getLogger("tandem.gateway.history")


def expiry_cutoff(limits: HistoryLimits, now: float) -> float:
    """Rows created before this instant are expired (-inf: nothing expires)."""
    return now - limits.ttl_s if limits.ttl_s else -math.inf


def tenant_cap(limits: HistoryLimits) -> int:
    """One tenant's cap in bytes as a store applies it (0: none). None reaching a store means
    nobody resolved the default share (a store built directly, as in tests): the total cap
    alone applies, as it did before there were per-tenant caps."""
    return limits.max_tenant_bytes or 0


def row_limit(limits: HistoryLimits) -> int:
    """The largest row a store accepts: ``max_response_bytes``, or a cap under it (a row over
    its tenant's cap, or the total cap, could not be stored even by evicting every other
    row). The settings keep both caps at or above ``max_response_bytes``; limits built
    directly may not."""
    caps = [cap for cap in (tenant_cap(limits), limits.max_total_bytes) if cap]
    return min([limits.max_response_bytes, *caps])


def check_size(size: int, limits: HistoryLimits) -> None:
    """Refuse one row over :func:`row_limit` before anything is written."""
    limit = row_limit(limits)
    if size > limit:
        raise ResponseTooLarge(size, limit)


def check_conversation_size(size: int, limits: HistoryLimits) -> None:
    """Refuse a change that would grow one conversation (one row) over :func:`row_limit`."""
    limit = row_limit(limits)
    if size > limit:
        raise ConversationTooLarge(size, limit)


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
