"""Build a routing policy from its name (the ``--policy`` flag)."""

from __future__ import annotations

from typing import Any

from tandem.gateway.workers.policies.base import Policy
from tandem.gateway.workers.policies.cache_aware import CacheAwarePolicy
from tandem.gateway.workers.policies.kv_events import KvEventsPolicy
from tandem.gateway.workers.policies.least_load import LeastLoadPolicy
from tandem.gateway.workers.policies.power_of_two import PowerOfTwoPolicy
from tandem.gateway.workers.policies.random_policy import RandomPolicy
from tandem.gateway.workers.policies.round_robin import RoundRobinPolicy

POLICIES: dict[str, type[Policy]] = {
    "round_robin": RoundRobinPolicy,
    "random": RandomPolicy,
    "power_of_two": PowerOfTwoPolicy,
    "least_load": LeastLoadPolicy,
    "cache_aware": CacheAwarePolicy,
    "kv_events": KvEventsPolicy,
}


def make_policy(name: str, **kwargs: Any) -> Policy:
    """A fresh policy; ``kwargs`` go to its constructor (e.g. ``seed``, ``threshold``)."""
    try:
        cls = POLICIES[name]
    except KeyError:
        valid = ", ".join(POLICIES)
        raise ValueError(f"unknown routing policy {name!r}; valid: {valid}") from None
    return cls(**kwargs)
