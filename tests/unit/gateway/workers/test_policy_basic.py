"""The stateless routing policies and the factory."""

from __future__ import annotations

from collections import Counter

import pytest

from tandem.gateway.workers.policies import (
    POLICIES,
    BasePolicy,
    Policy,
    PowerOfTwoPolicy,
    RandomPolicy,
    SelectionInput,
    make_policy,
)
from tandem.gateway.workers.worker import EngineLoad, Worker

REQ = SelectionInput(token_ids=[1, 2, 3], request_id="r")


def pool(*in_flight: int) -> list[Worker]:
    return [
        Worker(url=f"127.0.0.1:{7000 + i}", role="regular", labels={}, model_id="m", in_flight=n)
        for i, n in enumerate(in_flight)
    ]


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_handles_empty_and_single_pools(name: str) -> None:
    policy = make_policy(name)
    assert isinstance(policy, Policy) and policy.name == name
    assert policy.select([], REQ) is None
    (only,) = pool(5)
    assert policy.select([only], REQ) is only
    policy.on_request_complete(only, REQ)  # hooks exist on every policy
    policy.remove_worker(only.url)


def test_round_robin_cycles_in_order() -> None:
    workers = pool(0, 0, 0)
    policy = make_policy("round_robin")
    picks = [policy.select(workers, REQ) for _ in range(6)]
    assert picks == workers + workers


def test_random_spreads_and_replays_with_seed() -> None:
    workers = pool(0, 0, 0, 0)
    policy = RandomPolicy(seed=1)
    counts = Counter(policy.select(workers, REQ).url for _ in range(4000))
    assert set(counts) == {w.url for w in workers}
    assert all(800 <= c <= 1200 for c in counts.values()), counts
    first = RandomPolicy(seed=7)
    second = RandomPolicy(seed=7)
    assert [first.select(workers, REQ) for _ in range(20)] == [
        second.select(workers, REQ) for _ in range(20)
    ]


def test_power_of_two_prefers_fewer_in_flight() -> None:
    workers = pool(9, 0, 9)
    policy = PowerOfTwoPolicy(seed=3)
    counts = Counter(policy.select(workers, REQ).url for _ in range(3000))
    # The idle worker wins whenever it is sampled: 2 of the 3 possible pairs.
    assert counts[workers[1].url] / 3000 == pytest.approx(2 / 3, abs=0.05)
    busiest = pool(50, 1)
    assert all(PowerOfTwoPolicy(seed=s).select(busiest, REQ) is busiest[1] for s in range(20))


def test_least_load_takes_minimum_and_rotates_ties() -> None:
    workers = pool(3, 1, 1, 2)
    policy = make_policy("least_load")
    picks = [policy.select(workers, REQ) for _ in range(4)]
    assert picks == [workers[1], workers[2], workers[1], workers[2]]
    workers[2].in_flight = 0
    assert policy.select(workers, REQ) is workers[2]
    # Another gateway's traffic, as the engine reports it: worker 2 is the busiest now.
    workers[2].engine_load = EngineLoad(running=4, waiting=2)
    assert policy.select(workers, REQ) is not workers[2]


def test_factory_rejects_unknown_names_listing_valid_ones() -> None:
    with pytest.raises(ValueError, match="round_robin, random, power_of_two") as info:
        make_policy("fastest")
    assert "cache_aware" in str(info.value)


def test_factory_passes_options() -> None:
    policy = make_policy("cache_aware", threshold=0.9, max_nodes=10)
    assert policy.threshold == 0.9  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        make_policy("round_robin", seed=1)


def test_base_policy_hooks_are_noops() -> None:
    assert BasePolicy().remove_worker("x") is None
