"""Routing policies, one per file behind :class:`Policy`; build one with :func:`make_policy`."""

from tandem.gateway.workers.policies.base import BasePolicy, Policy, SelectionInput
from tandem.gateway.workers.policies.cache_aware import CacheAwarePolicy
from tandem.gateway.workers.policies.factory import POLICIES, make_policy
from tandem.gateway.workers.policies.least_load import LeastLoadPolicy
from tandem.gateway.workers.policies.power_of_two import PowerOfTwoPolicy
from tandem.gateway.workers.policies.random_policy import RandomPolicy
from tandem.gateway.workers.policies.round_robin import RoundRobinPolicy

__all__ = [
    "POLICIES",
    "BasePolicy",
    "CacheAwarePolicy",
    "LeastLoadPolicy",
    "Policy",
    "PowerOfTwoPolicy",
    "RandomPolicy",
    "RoundRobinPolicy",
    "SelectionInput",
    "make_policy",
]
