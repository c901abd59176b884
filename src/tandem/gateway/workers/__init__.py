"""The workers behind the gateway: registry, capability labels, health, breakers, client,
routing policies.

``WorkerRegistry.add`` connects a :class:`WorkerClient`, reads ``GetModelInfo`` and
``GetServerInfo`` into labels, and keeps a :class:`Worker` per URL; the
:class:`HealthChecker` keeps ``healthy`` current; a policy picks among
``registry.available(role, model_id)``.
"""

from tandem.gateway.workers.breaker import CircuitBreaker
from tandem.gateway.workers.client import GenerateStream, WorkerClient
from tandem.gateway.workers.health import HealthChecker
from tandem.gateway.workers.registry import WorkerRegistry, WorkerUnreachableError
from tandem.gateway.workers.worker import Worker

__all__ = [
    "CircuitBreaker",
    "GenerateStream",
    "HealthChecker",
    "Worker",
    "WorkerClient",
    "WorkerRegistry",
    "WorkerUnreachableError",
]
