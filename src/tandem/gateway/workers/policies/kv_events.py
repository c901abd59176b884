"""Event-fed cache-aware routing: the worker whose *own* KV events hold the longest prefix
of the request, weighed against the load its events report.

Where ``cache_aware`` guesses from what this gateway sent, this policy reads the index of
what each worker announced it stores and evicted (``gateway/kv_events``): correct by
construction, and the same on every gateway replica subscribed to the same workers.
Keys fold each image's hash into the blocks it overlaps, so two same-size images never
share cached blocks through the index.

Per candidate:

- *cached*: tokens of the request's leading blocks the worker holds. A worker with a
  live event stream is read from the index (blocks of its own block size; the prompt keyed
  unsalted, and also as text under the ``"mm:<hashes>"`` salt a pixel-less PD decode
  leg keys its blocks with, taking the longer). Any other worker (no stream yet, resyncing, or a
  protocol without the RPC) gets ``cache_aware``'s estimate from this policy's own
  per-worker prefix trees, which record every pick, so either source is ready. On the
  worker media path (``--mm-processing worker``, or ``auto`` with workers that take
  ``media_refs``) the gateway never sees the expanded image tokens, so the index matches
  only the text before the first image; there a live worker takes the larger of the index
  match and the estimate (``--mm-processing router`` keeps routing fully event-fed).
- *queue*: its ``EngineLoad`` (running + waiting, at least this gateway's in flight)
  while the record is fresh (under two heartbeats old), else ``Worker.load`` (this
  gateway's in flight, or the engine's polled queue when more); *uncached*: the
  record's ``waiting_uncached_tokens`` (0 without a fresh record): prefill work queued.

Rule, as ``cache_aware``'s with a balance guard:

1. Imbalance (max queue − min queue > ``balance_abs`` and max > ``balance_rel`` × min):
   the least loaded wins (ties: less uncached work, then the longer cached prefix).
2. Otherwise, if the longest cached prefix covers at least ``threshold`` of the prompt:
   the worker with it (ties: lower queue, then less uncached work).
3. Otherwise: lowest (queue, uncached work). Remaining ties take turns.

Under PD the dispatcher gives the prefill and the decode pool each their own instance
of this policy; both read the same index.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from smg_grpc_proto.generated import common_pb2 as common

from tandem.gateway.kv_events.index import KvEventIndex
from tandem.gateway.kv_events.keys import ContentKey, request_keys
from tandem.gateway.workers.policies.base import BasePolicy, SelectionInput
from tandem.gateway.workers.policies.cache_aware import CacheAwarePolicy
from tandem.gateway.workers.worker import Worker

# The media stage keys worker-path media by URL (gateway/pipeline/media.py): the prompt
# holds one anchor per image, not the placeholder run the worker's blocks hold.
_URL_KEYED = "url:"


def _worker_path(request: SelectionInput) -> bool:
    return any(mm_hash.startswith(_URL_KEYED) for _, _, mm_hash in request.media_runs)


class KvEventView(Protocol):
    """What the policy reads of the subscriptions (``KvEventManager``)."""

    index: KvEventIndex

    def live(self, url: str) -> bool: ...

    def fresh_load(self, url: str) -> common.EngineLoad | None: ...


# Lower than cache_aware's 0.5: turn 2 of an image chat re-sends turn 1 (image, text) and
# adds a reply and a new image of about the same size, so the cached part is just under
# half of it (the bench's measured 42 %); at 0.5 every second turn would go by load alone.
THRESHOLD = 0.25


class KvEventsPolicy(BasePolicy):
    name = "kv_events"

    def __init__(
        self,
        threshold: float = THRESHOLD,
        balance_abs: int = 16,
        balance_rel: float = 1.5,
        max_nodes: int = 50_000,
        events: KvEventView | None = None,
    ) -> None:
        if balance_abs < 0 or balance_rel < 1.0:
            raise ValueError("balance_abs must be >= 0 and balance_rel >= 1")
        self.threshold = threshold
        self.balance_abs = balance_abs
        self.balance_rel = balance_rel
        self.fallback = CacheAwarePolicy(threshold, max_nodes)  # validates threshold
        self.events = events
        self._next = 0

    def bind(self, events: KvEventView) -> None:
        """Read ``events`` (the gateway state binds its manager once it has one)."""
        self.events = events

    # -- choosing --------------------------------------------------------------------

    def cached_tokens(self, workers: Sequence[Worker], request: SelectionInput) -> dict[str, int]:
        """Per worker, the prompt tokens it holds: from its events if live, else estimated."""
        cached: dict[str, int] = {}
        by_size: dict[int, list[str]] = {}
        events = self.events
        for worker in workers:
            if events is not None and events.live(worker.url):
                by_size.setdefault(events.index.block_size(worker.url), []).append(worker.url)
            else:
                cached[worker.url] = self.fallback.matched_tokens(worker.url, request)
        if events is not None:
            for size, urls in by_size.items():
                found = dict.fromkeys(urls, 0)
                for keys in self._key_chains(request, size):
                    for url, n in events.index.leading_blocks(keys, urls).items():
                        found[url] = max(found[url], n * size)
                cached.update(found)
            if by_size and _worker_path(request):
                # The worker expands these images itself: the index can match only the
                # text before the first one, so this gateway's estimate may know more.
                for urls in by_size.values():
                    for url in urls:
                        estimate = self.fallback.matched_tokens(url, request)
                        cached[url] = max(cached[url], estimate)
        return cached

    def select(self, workers: Sequence[Worker], request: SelectionInput) -> Worker | None:
        if not workers:
            return None
        cached = self.cached_tokens(workers, request)
        work = {w.url: self._work(w) for w in workers}
        queues = [queue for queue, _ in work.values()]
        lo, hi = min(queues), max(queues)
        total = len(request.token_ids)
        best = max(cached.values())
        if hi - lo > self.balance_abs and hi > self.balance_rel * lo:
            ranked = sorted(workers, key=lambda w: (*work[w.url], -cached[w.url]))
            first = ranked[0]
            tied = [
                w
                for w in ranked
                if (*work[w.url], -cached[w.url]) == (*work[first.url], -cached[first.url])
            ]
        elif best > 0 and total > 0 and best / total >= self.threshold:
            holders = [w for w in workers if cached[w.url] == best]
            least = min(work[w.url] for w in holders)
            tied = [w for w in holders if work[w.url] == least]
        else:
            least = min(work.values())
            tied = [w for w in workers if work[w.url] == least]
        chosen = tied[self._next % len(tied)]
        self._next += 1
        # The fallback's tree learns every pick, so a worker whose stream drops is still
        # estimated from what this gateway sent it.
        self.fallback.select([chosen], request)
        return chosen

    def remove_worker(self, url: str) -> None:
        self.fallback.remove_worker(url)

    # -- helpers ---------------------------------------------------------------------

    def _work(self, worker: Worker) -> tuple[int, int]:
        record = self.events.fresh_load(worker.url) if self.events is not None else None
        if record is None:
            return worker.load, 0
        queue = max(worker.in_flight, record.running_requests + record.waiting_requests)
        uncached = (
            record.waiting_uncached_tokens if record.HasField("waiting_uncached_tokens") else 0
        )
        return queue, uncached

    @staticmethod
    def _key_chains(request: SelectionInput, block_size: int) -> list[list[ContentKey]]:
        chains = [request_keys(request.token_ids, request.media_runs, block_size)]
        if request.media_runs:
            # A leg that carries its images' hashes only (a PD decode leg) is keyed by the
            # worker as text under the salt "mm:<hashes in prompt order>", with no media
            # items (block_keys.hash_salt, worker/vllm/inputs.py's wire_media).
            hashes = [mm_hash for _, _, mm_hash in sorted(request.media_runs)]
            salt = "mm:" + ",".join(hashes)
            chains.append(request_keys(request.token_ids, (), block_size, salt))
        return chains
