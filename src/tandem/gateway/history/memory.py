"""``--history-backend memory``: stored responses in this process only, lost on restart.

Rows are kept encoded, as the SQL backends keep them, so that a caller mutating a dict after
``put`` (or after ``get``) changes nothing stored, and sizes are counted the same way.

The caps hold at every moment, not only after a sweep: ``put`` itself deletes the tenant's
oldest rows while its rows are over the tenant's cap, then the oldest of anyone's while all
rows are over the total cap. The row just written is never among them (its client is about
to be told it is stored). The sweeper is left with expiring rows by age.

Conversations (``memconv.py``) are rows of the same index, under the same caps.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tandem.gateway.history.codec import decoded, encoded
from tandem.gateway.history.memconv import Conversation, MemoryConversations
from tandem.gateway.history.memindex import AgeIndex, Key
from tandem.gateway.history.retention import Sweeper, check_size, expiry_cutoff, tenant_cap
from tandem.gateway.history.store import (
    BrokenChain,
    ChainTooLong,
    HistoryLimits,
    StoredResponse,
)

log = logging.getLogger("tandem.gateway.history")


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


class MemoryStore(MemoryConversations):
    """Every method runs without awaiting inside, so each is atomic on the event loop.

    Usable without :meth:`start` (it only starts the retention sweeper).
    """

    def __init__(
        self, limits: HistoryLimits | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self.limits = limits or HistoryLimits()
        self._clock = clock
        self._rows: dict[Key, _Row] = {}
        self._conversations: dict[Key, Conversation] = {}
        self._ages = AgeIndex()  # the same rows by age, and the bytes each tenant holds
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
        key = (item.tenant, item.id)
        self._rows[key] = row
        self._ages.add(key, row.created_at, row.size)
        evicted = self._evict((item.tenant,), keep=key)
        if evicted:
            log.debug("history memory: %d stored responses evicted to stay under the caps", evicted)

    def _evict(self, tenants: Iterable[str], keep: Key | None) -> int:
        """Delete ``tenants``' oldest rows while each is over its cap, then anyone's oldest
        while the total is over its cap; never ``keep``. Returns how many rows went.

        The tenant's own rows go first so that a tenant within its cap loses nothing to
        another one's large responses; the total cap still holds when the tenants' caps
        add up to more than it.
        """
        deleted = 0
        per_tenant, cap = tenant_cap(self.limits), self.limits.max_total_bytes
        for tenant in tenants if per_tenant else ():
            while self._ages.tenant_bytes(tenant) > per_tenant:
                if not self._drop(self._ages.pop_oldest(tenant, keep)):
                    break
                deleted += 1
        while cap and self._ages.total_bytes > cap:
            if not self._drop(self._ages.pop_oldest(None, keep)):
                break
            deleted += 1
        return deleted

    def _drop(self, key: Key | None) -> bool:
        if key is None:  # only ``keep`` is left, and it fits (check_size)
            return False
        if self._rows.pop(key, None) is None:
            del self._conversations[key]  # response and conversation ids never collide
        return True

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
        self._ages.discard((tenant, response_id))
        return True

    async def sweep(self) -> int:
        cutoff = expiry_cutoff(self.limits, self._clock())
        expired = [key for key, row in self._rows.items() if row.created_at < cutoff]
        for key in expired:
            del self._rows[key]
            self._ages.discard(key)
        gone = [key for key, row in self._conversations.items() if row.updated_at < cutoff]
        for key in gone:
            del self._conversations[key]
            self._ages.discard(key)
        expired += gone
        # Every put applied the caps already, so this finds nothing over them; it keeps
        # sweep() the whole of retention, as the contract (store.py) has it.
        return len(expired) + self._evict(self._ages.tenants(), keep=None)
