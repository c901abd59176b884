"""A per-worker circuit breaker: stop sending to a worker that keeps failing.

States::

    closed ──N consecutive failures──▶ open ──cooldown──▶ half_open
      ▲                                 ▲                    │
      └──────────── success ────────────┼──── (probe) ───────┤
                                        └────── failure ─────┘

Half-open lets exactly one probe through. A probe whose outcome is never
recorded (its request vanished) is released again after another cooldown, so a
lost probe cannot strand the worker. A call that began after the breaker opened and
succeeded is a probe too (the health checker passes its start for a worker that was
down), and closes it at once: a worker restarted on its address is routed to again
within a health interval, not after the cooldown.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

BreakerState = Literal["closed", "open", "half_open"]


class CircuitBreaker:
    def __init__(
        self,
        failure_threshold: int = 5,
        cooldown_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if failure_threshold < 1:
            raise ValueError("failure_threshold must be >= 1")
        if cooldown_s < 0:
            raise ValueError("cooldown_s must be >= 0")
        self.failure_threshold = failure_threshold
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._state: BreakerState = "closed"
        self._failures = 0
        self._opened_at = 0.0
        self._probe_at: float | None = None  # when the half-open probe was handed out

    @property
    def state(self) -> BreakerState:
        # Open turns half-open lazily, on the first look after the cooldown.
        if self._state == "open" and self._clock() - self._opened_at >= self.cooldown_s:
            self._state = "half_open"
            self._probe_at = None
        return self._state

    @property
    def consecutive_failures(self) -> int:
        return self._failures

    def can_attempt(self) -> bool:
        """Would :meth:`allow` say yes? Does not claim the half-open probe (for filtering)."""
        state = self.state
        if state == "closed":
            return True
        if state == "open":
            return False
        return self._probe_free()

    def allow(self) -> bool:
        """May a request go to this worker now? In half-open this claims the single probe."""
        state = self.state
        if state == "closed":
            return True
        if state == "open" or not self._probe_free():
            return False
        self._probe_at = self._clock()
        return True

    def now(self) -> float:
        """The breaker's clock: what :meth:`record_success` takes as ``started_at``."""
        return self._clock()

    def record_success(self, started_at: float | None = None) -> None:
        """A success; ``started_at``: when the call began (:meth:`now`), if it is known."""
        state = self.state
        if state == "open" and (started_at is None or started_at < self._opened_at):
            # A straggler that started before the breaker opened proves little; wait for the
            # cooldown and a real probe (a call begun since the breaker opened is one).
            return
        self._state = "closed"
        self._failures = 0
        self._probe_at = None

    def record_failure(self) -> None:
        state = self.state
        self._failures += 1
        if state == "half_open" or state == "open" or self._failures >= self.failure_threshold:
            # A failed probe, or more failures while open, restart the cooldown.
            self._state = "open"
            self._opened_at = self._clock()
            self._probe_at = None

    def _probe_free(self) -> bool:
        return self._probe_at is None or self._clock() - self._probe_at >= self.cooldown_s

    def __repr__(self) -> str:
        return f"CircuitBreaker(state={self.state!r}, failures={self._failures})"
