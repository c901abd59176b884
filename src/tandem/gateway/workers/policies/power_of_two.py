"""Power of two choices: sample two workers at random, send to the less busy one.

Nearly as good as least-load at spreading work, without every gateway request
herding onto the same momentarily idle worker.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from tandem.gateway.workers.policies.base import BasePolicy, SelectionInput
from tandem.gateway.workers.worker import Worker


class PowerOfTwoPolicy(BasePolicy):
    name = "power_of_two"

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)

    def select(self, workers: Sequence[Worker], request: SelectionInput) -> Worker | None:
        if not workers:
            return None
        if len(workers) == 1:
            return workers[0]
        first, second = self._rng.sample(range(len(workers)), 2)
        a, b = workers[first], workers[second]
        return b if b.load < a.load else a
