"""Uniformly random choice; seedable so tests and benchmarks can replay it."""

from __future__ import annotations

import random
from collections.abc import Sequence

from tandem.gateway.workers.policies.base import BasePolicy, SelectionInput
from tandem.gateway.workers.worker import Worker


class RandomPolicy(BasePolicy):
    name = "random"

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)

    def select(self, workers: Sequence[Worker], request: SelectionInput) -> Worker | None:
        if not workers:
            return None
        return workers[self._rng.randrange(len(workers))]
