"""Abort requests waiting to meet their request: bounded in time and in number.

An Abort may reach the worker before the request it names (the gateway dropped a
stream whose Generate call is still queued) or after it finished (the drop raced the
last frame), or name a request this worker never saw. The first case is why aborts
are remembered at all; the other two would be remembered forever. So an abort is kept
for :data:`ABORT_MEMORY_S` seconds at most, and at most :data:`MAX_PENDING` of them.
Thread-safe: RPC threads add, the compute thread takes.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

# A Generate call queued behind its own Abort arrives within moments; a minute is ample.
ABORT_MEMORY_S = 60.0
MAX_PENDING = 4096


class PendingAborts:
    def __init__(
        self,
        memory_s: float = ABORT_MEMORY_S,
        max_pending: int = MAX_PENDING,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.memory_s = memory_s
        self.max_pending = max_pending
        self._clock = clock
        self._ids: OrderedDict[str, float] = OrderedDict()  # id -> when, oldest first
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, request_id: str) -> None:
        with self._lock:
            self._ids.pop(request_id, None)
            self._ids[request_id] = self._clock()
            self._forget_old()

    def take(self, request_id: str) -> bool:
        """True (once) if ``request_id`` was aborted and that abort is still remembered."""
        with self._lock:
            self._forget_old()
            return self._ids.pop(request_id, None) is not None

    def take_any(self, request_ids: Iterable[str]) -> list[str]:
        """The ids among ``request_ids`` that are aborted; each is forgotten here."""
        with self._lock:
            self._forget_old()
            if not self._ids:
                return []
            hits = [rid for rid in request_ids if rid in self._ids]
            for rid in hits:
                del self._ids[rid]
            return hits

    def _forget_old(self) -> None:
        horizon = self._clock() - self.memory_s
        while self._ids and (
            len(self._ids) > self.max_pending or next(iter(self._ids.values())) < horizon
        ):
            self._ids.popitem(last=False)
