"""Stop strings over a stream of text deltas.

Text is released as soon as it cannot be the start of a stop string; a suffix
that could still grow into one is held back until the next delta decides. The
stop string itself is never emitted, as in OpenAI's API.

Which stop wins is defined on the text, not on how it was split into deltas:
the occurrence that *ends* first (generation would have stopped there), and
among those ending at the same place the longest one. Output is the text
before that occurrence.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StopResult:
    text: str  # safe to emit now
    stopped: bool = False
    stop: str | None = None  # the stop string that matched, when stopped


_NOTHING = StopResult("")


class StopMatcher:
    def __init__(self, stops: Iterable[str]) -> None:
        # Empty strings would match everywhere; the schema refuses them, so drop them here.
        self.stops: tuple[str, ...] = tuple(dict.fromkeys(s for s in stops if s))
        self._held = ""
        self.stopped = False
        self.matched: str | None = None

    def push(self, delta: str) -> StopResult:
        """Feed a delta; get the text that is now safe to emit, and whether a stop hit."""
        if self.stopped:
            return _NOTHING
        if not self.stops:
            return StopResult(delta)
        buffer = self._held + delta
        hit = self._first_stop(buffer)
        if hit is not None:
            start, stop = hit
            self.stopped, self.matched, self._held = True, stop, ""
            return StopResult(buffer[:start], stopped=True, stop=stop)
        keep = self._partial_len(buffer)
        self._held = buffer[len(buffer) - keep :]
        return StopResult(buffer[: len(buffer) - keep])

    def flush(self) -> str:
        """Generation ended without a stop: release the held-back text."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def _first_stop(self, buffer: str) -> tuple[int, str] | None:
        # The held text contains no whole stop (we would have stopped), so any
        # occurrence found here is new. A stop's first occurrence is also its
        # earliest-ending one.
        best: tuple[int, int, str] | None = None  # (end, -length, stop)
        for stop in self.stops:
            start = buffer.find(stop)
            if start >= 0:
                key = (start + len(stop), -len(stop), stop)
                if best is None or key < best:
                    best = key
        if best is None:
            return None
        end, neg_len, stop = best
        return end + neg_len, stop

    def _partial_len(self, buffer: str) -> int:
        """Length of the longest suffix of ``buffer`` that is a proper prefix of a stop."""
        longest = 0
        for stop in self.stops:
            for k in range(min(len(stop) - 1, len(buffer)), longest, -1):
                if buffer.endswith(stop[:k]):
                    longest = k
                    break
        return longest
