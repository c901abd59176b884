"""``--history-backend memory``: stored responses in this process only, lost on restart.

Rows are kept encoded, as the SQL backends keep them, so that a caller mutating a dict after
``put`` (or after ``get``) changes nothing stored, and sizes are counted the same way.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from tandem.gateway.history.codec import decoded, encoded
from tandem.gateway.history.retention import Sweeper, check_size, expiry_cutoff
from tandem.gateway.history.store import (
    BrokenChain,
    ChainTooLong,
    HistoryLimits,
    StoredResponse,
)


@dataclass(frozen=True, slots=True)
class _Row:
    id: str
    tenant: str
    previous_id: str | None
    created_at: float
    status: str
    model: str
    response: bytes
    input_items: bytes

    @property
    def size(self) -> int:
        return len(self.response) + len(self.input_items)

    def stored(self) -> StoredResponse:
        return StoredResponse(
            id=self.id,
            tenant=self.tenant,
            previous_id=self.previous_id,
            created_at=self.created_at,
            status=self.status,
            model=self.model,
            response=decoded(self.response),
            input_items=decoded(self.input_items),
        )


class MemoryStore:
    """Every method runs without awaiting inside, so each is atomic on the event loop.

    Usable without :meth:`start` (it only starts the retention sweeper).
    """

    def __init__(
        self, limits: HistoryLimits | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self.limits = limits or HistoryLimits()
        self._clock = clock
        self._rows: dict[tuple[str, str], _Row] = {}
        self._sweeper = Sweeper(self.sweep, self.limits.sweep_interval_s, self.name)

    @property
    def name(self) -> str:
        return "memory"

    def __repr__(self) -> str:
        return "memory (this process only)"

    async def start(self) -> None:
        await self._sweeper.start()

    async def close(self) -> None:
        await self._sweeper.stop()

    async def put(self, item: StoredResponse) -> None:
        row = _Row(
            id=item.id,
            tenant=item.tenant,
            previous_id=item.previous_id,
            created_at=item.created_at,
            status=item.status,
            model=item.model,
            response=encoded(item.response),
            input_items=encoded(item.input_items),
        )
        check_size(row.size, self.limits)
        self._rows[(item.tenant, item.id)] = row

    def _live(self, tenant: str, response_id: str) -> _Row | None:
        row = self._rows.get((tenant, response_id))
        if row is None or row.created_at < expiry_cutoff(self.limits, self._clock()):
            return None
        return row

    async def get(self, tenant: str, response_id: str) -> StoredResponse | None:
        row = self._live(tenant, response_id)
        return row.stored() if row is not None else None

    async def chain(self, tenant: str, response_id: str) -> list[StoredResponse] | None:
        row = self._live(tenant, response_id)
        if row is None:
            return None
        turns = [row]
        while row.previous_id is not None:
            previous = self._live(tenant, row.previous_id)
            if previous is None:
                raise BrokenChain(row.previous_id)
            if len(turns) == self.limits.max_turns:  # as the SQL walk: max_turns + 1 rows
                raise ChainTooLong(self.limits.max_turns)
            row = previous
            turns.append(row)
        return [turn.stored() for turn in reversed(turns)]

    async def delete(self, tenant: str, response_id: str) -> bool:
        if self._live(tenant, response_id) is None:
            return False
        del self._rows[(tenant, response_id)]
        return True

    async def sweep(self) -> int:
        before = len(self._rows)
        cutoff = expiry_cutoff(self.limits, self._clock())
        self._rows = {key: row for key, row in self._rows.items() if row.created_at >= cutoff}
        cap = self.limits.max_total_bytes
        if cap:
            total = sum(row.size for row in self._rows.values())
            oldest_first = sorted(self._rows.items(), key=lambda kv: (kv[1].created_at, kv[0]))
            for key, row in oldest_first:
                if total <= cap:
                    break
                del self._rows[key]
                total -= row.size
        return before - len(self._rows)
