"""An engine's counters, and the snapshot of them that the worker's Stats call reports."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypedDict

from tandem.engine.kv_store import KvStore
from tandem.engine.prefix_cache import PrefixCache


@dataclass(slots=True)
class EngineStats:
    """Counters read by the worker's stats endpoint (updated on the compute thread)."""

    requests_by_outcome: dict[str, int] = field(default_factory=dict)
    prompt_tokens: int = 0
    generated_tokens: int = 0
    prefill_computed_tokens: int = 0  # prompt tokens actually run through the model

    def count(self, outcome: str) -> None:
        self.requests_by_outcome[outcome] = self.requests_by_outcome.get(outcome, 0) + 1


class EngineCounters(TypedDict):
    """The engine's part of the side channel's Stats answer (tests and benchmarks read it)."""

    held_kv_blocks: int
    held_transfers: int
    kv_stored: int
    kv_released: int
    kv_expired: int
    prefix_cache_lookups: int
    prefix_cache_hit_tokens: int
    prefix_cache_blocks: int
    prefill_computed_tokens: int
    vision_encodes: int  # vision tower calls: images encoded here, not taken as features
    requests_by_outcome: dict[str, int]
    running: int


def engine_counters(
    stats: EngineStats, cache: PrefixCache, store: KvStore, running: int, *, vision_encodes: int
) -> EngineCounters:
    """One snapshot, built the same way for every engine so that their answers match.

    ``vision_encodes`` is asked of every engine by name (0 for one without a tower): an
    E/P/D prefill worker proves with it that it took its images' features from elsewhere.
    """
    return {
        "held_kv_blocks": store.held_blocks,
        "held_transfers": store.held_count,
        "kv_stored": store.stored,
        "kv_released": store.released,
        "kv_expired": store.expired,
        "prefix_cache_lookups": cache.lookups,
        "prefix_cache_hit_tokens": cache.hits_tokens,
        "prefix_cache_blocks": cache.num_blocks,
        "prefill_computed_tokens": stats.prefill_computed_tokens,
        "vision_encodes": vision_encodes,
        "requests_by_outcome": dict(stats.requests_by_outcome),
        "running": running,
    }
