"""Round robin: each worker in turn."""

from __future__ import annotations

from collections.abc import Sequence

from tandem.gateway.workers.policies.base import BasePolicy, SelectionInput
from tandem.gateway.workers.worker import Worker


class RoundRobinPolicy(BasePolicy):
    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def select(self, workers: Sequence[Worker], request: SelectionInput) -> Worker | None:
        if not workers:
            return None
        # The list may shrink or grow between calls; the modulo keeps the cursor valid.
        worker = workers[self._next % len(workers)]
        self._next += 1
        return worker
