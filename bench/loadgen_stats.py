"""Small statistics shared by the load generator and the bench's summaries."""

from __future__ import annotations


def percentile(values: list[float], q: float) -> float | None:
    """The nearest-rank ``q`` quantile of ``values`` (None when empty)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
