"""The chaos soak's driver: every 20-40 s (seeded; ``--gap-s``) one random worker is
SIGKILLed and started again on its port, or SIGSTOPped for 3-5 s and then SIGCONTed.

Recovery is read off the worker's own counters (the side channel's Stats call), polled
every 50 ms from the restarted process's ready line (or from the SIGCONT):
- ``routed_s``: to the first poll that shows a leg running or ended there since (the
  gateway routes to it again; a leg shorter than a poll can be seen only once it ended);
- ``recovery_s``: to the first poll that shows a leg it finished since
  (``requests_by_outcome["finished"]``): routed to it and answered, so it includes one
  leg's own time (a 32-64 token decode).
A figure is exact to the poll period plus one Stats round trip (a few ms on loopback).
After a SIGCONT the legs that were frozen in the worker may still finish; they are not
new routing, so that round waits for more finished legs than were running at SIGCONT
(an over-estimate when some of those end as aborts instead).
"""

from __future__ import annotations

import random
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any

from bench.chaos_procs import Child, finished, restart, stats

POLL_S = 0.05
RECOVERY_WAIT_S = 90.0


@dataclass
class Round:
    at_s: float  # seconds since the soak began
    worker: str
    address: str
    signal: str
    down_s: float  # kill to ready line, or SIGSTOP to SIGCONT
    routed_s: float | None  # None: no leg seen within RECOVERY_WAIT_S
    recovery_s: float | None  # None: no leg finished within RECOVERY_WAIT_S

    def as_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


def _legs(counters: dict[str, Any] | None) -> int:
    """Legs running or ended (any outcome): each one the gateway routed here."""
    if not counters:
        return 0
    return int(counters.get("running", 0)) + sum(counters.get("requests_by_outcome", {}).values())


def _first_legs(
    address: str, base_legs: int, base_finished: int, since: float
) -> tuple[float | None, float | None]:
    """(routed_s, recovery_s) after ``since``: a new leg seen, a new leg finished."""
    deadline = since + RECOVERY_WAIT_S
    routed: float | None = None
    while time.monotonic() < deadline:
        counters = stats(address, timeout=1.0)
        now = time.monotonic() - since
        if routed is None and _legs(counters) > base_legs:
            routed = now
        if finished(counters) > base_finished:
            return (now if routed is None else routed), now
        time.sleep(POLL_S)
    return routed, None


class Chaos:
    """Runs on its own thread; ``workers`` is shared with the soak (restarts replace items)."""

    def __init__(
        self,
        workers: list[Child],
        seed: int,
        began: float,
        stop_at: float,
        stop_share: float,
        gap_s: tuple[float, float] | list[float] = (20.0, 40.0),
    ) -> None:
        self.workers, self.rng = workers, random.Random(seed)
        self.began, self.stop_at, self.stop_share = began, stop_at, stop_share
        self.gap_s = (float(gap_s[0]), float(gap_s[1]))
        self.rounds: list[Round] = []
        self.error = ""
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)

    def _run(self) -> None:
        try:
            while True:
                wait = self.rng.uniform(*self.gap_s)
                # A round needs time to be measured before the load stops.
                if time.monotonic() + wait + 15.0 > self.stop_at:
                    return
                time.sleep(wait)
                self._round()
        except Exception as error:  # a worker that cannot start again ends the chaos, said
            self.error = f"{type(error).__name__}: {error}"

    def _round(self) -> None:
        index = self.rng.randrange(len(self.workers))
        child = self.workers[index]
        at = time.monotonic() - self.began
        if self.rng.random() < self.stop_share:
            child.signal(signal.SIGSTOP)
            pause = self.rng.uniform(3.0, 5.0)
            time.sleep(pause)
            child.signal(signal.SIGCONT)
            since = time.monotonic()
            counters = stats(child.address) or {}
            frozen = int(counters.get("running", 0))  # legs that were in there all along
            base_legs = _legs(counters)
            got = _first_legs(child.address, base_legs, finished(counters) + frozen, since)
            self.rounds.append(Round(at, child.name, child.address, "SIGSTOP", pause, *got))
            return
        killed = time.monotonic()
        child.kill()
        fresh = restart(child)
        self.workers[index] = fresh
        got = _first_legs(fresh.address, 0, 0, fresh.ready_at)
        down = fresh.ready_at - killed
        self.rounds.append(Round(at, child.name, fresh.address, "SIGKILL", down, *got))
