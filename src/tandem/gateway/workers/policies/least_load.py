"""Least load: the worker with the fewest requests (``Worker.load``: this gateway's in flight,
or the engine's reported queue when that is more); ties take turns."""

from __future__ import annotations

from collections.abc import Sequence

from tandem.gateway.workers.policies.base import BasePolicy, SelectionInput
from tandem.gateway.workers.worker import Worker


class LeastLoadPolicy(BasePolicy):
    name = "least_load"

    def __init__(self) -> None:
        self._next = 0

    def select(self, workers: Sequence[Worker], request: SelectionInput) -> Worker | None:
        if not workers:
            return None
        lowest = min(w.load for w in workers)
        tied = [w for w in workers if w.load == lowest]
        # Rotating among ties keeps idle workers evenly used when load is always zero.
        worker = tied[self._next % len(tied)]
        self._next += 1
        return worker
