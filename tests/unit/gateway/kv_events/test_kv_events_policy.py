"""The ``kv_events`` policy: longest prefix the workers' own events hold, weighed against
their EngineLoad; per-worker fallback to the cache-aware estimate where no stream is live.

The index is fed by the worker's real prefix cache and publisher (``kv_event_source.py``);
``View`` stands in for the gateway's ``KvEventManager`` (which streams, live flags and load
records it has), tested over real streams in test_kv_event_manager.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kv_event_source import WorkerCache, image_prompt
from smg_grpc_proto.generated import common_pb2 as common

from tandem.engine.types import MediaItem
from tandem.gateway.kv_events.index import KvEventIndex
from tandem.gateway.workers.policies.base import SelectionInput
from tandem.gateway.workers.policies.factory import make_policy
from tandem.gateway.workers.policies.kv_events import KvEventsPolicy
from tandem.gateway.workers.worker import Worker

PROMPT = list(range(100, 132))  # 8 blocks of 4
RED, BLUE = "a1" * 16, "b2" * 16
PAD = 151655


@dataclass
class View:
    index: KvEventIndex = field(default_factory=KvEventIndex)
    streams: set[str] = field(default_factory=set)
    loads: dict[str, common.EngineLoad] = field(default_factory=dict)

    def live(self, url: str) -> bool:
        return url in self.streams

    def fresh_load(self, url: str) -> common.EngineLoad | None:
        return self.loads.get(url)

    def cached(self, url: str, tokens: list[int], media: list[MediaItem] | None = None) -> None:
        """``url``'s worker prefilled ``tokens``; its events reach the index."""
        worker = WorkerCache()
        worker.prefill(tokens, media or [])
        for batch in worker.new_batches():
            self.index.apply(url, batch.events)
        self.streams.add(url)


def pool(n: int) -> list[Worker]:
    return [Worker(url=f"w{i}", role="prefill", labels={}, model_id="m") for i in range(n)]


def policy_over(view: View) -> KvEventsPolicy:
    policy = make_policy("kv_events")
    assert isinstance(policy, KvEventsPolicy)
    policy.bind(view)
    return policy


def load(running: int, waiting: int = 0, uncached: int = 0) -> common.EngineLoad:
    return common.EngineLoad(
        running_requests=running, waiting_requests=waiting, waiting_uncached_tokens=uncached
    )


def test_longest_cached_prefix_wins_over_a_little_more_load() -> None:
    _w0, w1, _w2 = workers = pool(3)
    view = View()
    view.cached("w0", PROMPT[:8])
    view.cached("w1", PROMPT[:24])
    view.cached("w2", [9] * 32)  # something else entirely
    view.loads = {"w0": load(0), "w1": load(3), "w2": load(0)}
    policy = policy_over(view)
    request = SelectionInput(PROMPT)
    assert policy.cached_tokens(workers, request) == {"w0": 8, "w1": 24, "w2": 0}
    for _ in range(3):
        assert policy.select(workers, request) is w1


def test_equal_prefix_goes_to_the_less_loaded_then_less_uncached() -> None:
    w0, w1 = workers = pool(2)
    view = View()
    view.cached("w0", PROMPT)
    view.cached("w1", PROMPT)
    policy = policy_over(view)
    view.loads = {"w0": load(2), "w1": load(1)}
    assert policy.select(workers, SelectionInput(PROMPT)) is w1
    view.loads = {"w0": load(1, uncached=10), "w1": load(1, uncached=500)}
    assert policy.select(workers, SelectionInput(PROMPT)) is w0
    w0.in_flight = 4  # this gateway's own count outweighs a lagging record
    assert policy.select(workers, SelectionInput(PROMPT)) is w1


def test_imbalance_overrides_the_cache() -> None:
    _w0, w1 = workers = pool(2)
    view = View()
    view.cached("w0", PROMPT)
    view.cached("w1", [])
    view.loads = {"w0": load(30, waiting=10), "w1": load(2)}
    assert policy_over(view).select(workers, SelectionInput(PROMPT)) is w1


def test_short_match_falls_to_the_least_loaded() -> None:
    _w0, w1 = workers = pool(2)
    view = View()
    view.cached("w0", PROMPT[:4])  # 4 of 32 tokens: under the 0.5 threshold
    view.cached("w1", [])
    view.loads = {"w0": load(2), "w1": load(1)}
    assert policy_over(view).select(workers, SelectionInput(PROMPT)) is w1


def test_fallback_is_per_worker() -> None:
    _w0, w1 = workers = pool(2)
    view = View()
    view.cached("w0", [])  # live, holds nothing of the prompt
    policy = policy_over(view)  # w1 has no stream (an MLX worker, or --no-kv-events)
    first = policy.select([w1], SelectionInput(PROMPT))  # this gateway sent it there
    assert first is w1
    cached = policy.cached_tokens(workers, SelectionInput(PROMPT))
    assert cached == {"w0": 0, "w1": 32}  # w1: the cache-aware estimate
    w1.in_flight = 1  # busier, but the estimate holds the prefix
    assert policy.select(workers, SelectionInput(PROMPT)) is w1
    # Once w1's stream is live its events rule: it announced nothing, so no prefix.
    view.streams.add("w1")
    assert policy.cached_tokens(workers, SelectionInput(PROMPT)) == {"w0": 0, "w1": 0}


def test_image_identity_routes_red_and_blue_apart() -> None:
    w0, w1 = workers = pool(2)
    prompt = image_prompt([1, 2, 3, 4], PAD, 24, [5, 6, 7, 8])
    view = View()
    view.cached("w0", prompt, [MediaItem(RED, 4, 24)])
    view.cached("w1", prompt, [MediaItem(BLUE, 4, 24)])
    policy = policy_over(view)
    red = SelectionInput(prompt, [(4, 24, RED)])
    blue = SelectionInput(prompt, [(4, 24, BLUE)])
    assert policy.cached_tokens(workers, red) == {"w0": 32, "w1": 4}
    assert policy.select(workers, red) is w0
    assert policy.select(workers, blue) is w1


def test_pixel_less_leg_is_matched_under_its_hash_salt() -> None:
    _w0, _w1 = workers = pool(2)
    view = View()
    # A PD decode worker keys a pixel-less leg as text under "mm:<hashes>".
    salted = WorkerCache()
    salted.prefill(PROMPT, salt="mm:" + RED)
    for batch in salted.new_batches():
        view.index.apply("w1", batch.events)
    view.streams |= {"w0", "w1"}
    request = SelectionInput(PROMPT, [(4, 8, RED)])
    assert policy_over(view).cached_tokens(workers, request) == {"w0": 0, "w1": 32}


def test_worker_media_path_takes_the_estimate_past_the_first_image() -> None:
    # On the worker path the gateway sees one anchor per image keyed by URL: the index
    # cannot match past it, the policy's own record of its picks can.
    _w0, w1 = workers = pool(2)
    view = View()
    view.cached("w0", [])
    view.cached("w1", [])
    policy = policy_over(view)
    request = SelectionInput([1, 2, 3, 4, 5, 6, 7, PAD, 9, 10, 11, 12], [(7, 1, "url:ab12")])
    assert policy.select([w1], request) is w1
    assert policy.cached_tokens(workers, request) == {"w0": 0, "w1": 12}
