"""The memory store's rows by age, overall and per tenant, with the bytes each holds.

The memory backend applies its caps in ``put`` itself (RAM is the cap there, and a sweep a
minute later is too late), so a full store finds "this tenant's oldest row" and "the
oldest row" on most puts. Sorting every row each time would make each such put O(n log n);
min-heaps answer in O(log n). Entries are never taken out of the middle of a heap: a row
deleted or replaced leaves its entries behind, told stale by the row's serial number, and a
heap is rebuilt once most of it is stale, so the heaps stay within a constant of the rows.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

Key = tuple[str, str]  # (tenant, response id), as the memory store keys its rows
# created_at, tenant, id, serial: the order the SQL sweep deletes in (oldest, then by key).
_Entry = tuple[float, str, str, int]
# A heap is rebuilt when it holds more than twice its live rows, plus this slack (so that a
# few rows deleted from a small heap do not rebuild it each time).
_SLACK = 64


@dataclass(slots=True)
class _Share:
    """One tenant's rows, or all of them: their bytes, their number, their ages."""

    bytes: int = 0
    rows: int = 0
    heap: list[_Entry] = field(default_factory=list)


class AgeIndex:
    def __init__(self) -> None:
        self._overall = _Share()
        self._tenants: dict[str, _Share] = {}
        self._live: dict[Key, tuple[int, int]] = {}  # key → (serial, size)
        self._serials = itertools.count()

    @property
    def total_bytes(self) -> int:
        return self._overall.bytes

    def tenant_bytes(self, tenant: str) -> int:
        share = self._tenants.get(tenant)
        return share.bytes if share is not None else 0

    def tenants(self) -> list[str]:
        return list(self._tenants)

    def add(self, key: Key, created_at: float, size: int) -> None:
        """Count one row (a key already counted is replaced: its old size no longer counts)."""
        self.discard(key)
        serial = next(self._serials)
        self._live[key] = (serial, size)
        entry = (created_at, key[0], key[1], serial)
        for share in (self._overall, self._tenants.setdefault(key[0], _Share())):
            share.bytes += size
            share.rows += 1
            heapq.heappush(share.heap, entry)

    def discard(self, key: Key) -> None:
        live = self._live.pop(key, None)
        if live is None:
            return
        size = live[1]
        tenant = self._tenants[key[0]]
        for share in (self._overall, tenant):
            share.bytes -= size
            share.rows -= 1
            if len(share.heap) > 2 * share.rows + _SLACK:
                self._rebuild(share)
        if not tenant.rows:
            del self._tenants[key[0]]  # its heap holds only stale entries now

    def pop_oldest(self, tenant: str | None, keep: Key | None = None) -> Key | None:
        """Uncount and return the oldest row (``tenant``'s, or anyone's for None), never
        ``keep``; None when there is no other row."""
        share = self._overall if tenant is None else self._tenants.get(tenant)
        if share is None:
            return None
        held: _Entry | None = None
        found: Key | None = None
        while share.heap:
            entry = heapq.heappop(share.heap)
            key = (entry[1], entry[2])
            if not self._is_live(entry):
                continue
            if key == keep:
                held = entry  # put back below: the next oldest may be another row
                continue
            found = key
            break
        if held is not None:
            heapq.heappush(share.heap, held)
        if found is not None:
            self.discard(found)
        return found

    def _is_live(self, entry: _Entry) -> bool:
        live = self._live.get((entry[1], entry[2]))
        return live is not None and live[0] == entry[3]

    def _rebuild(self, share: _Share) -> None:
        share.heap = [entry for entry in share.heap if self._is_live(entry)]
        heapq.heapify(share.heap)
