"""The workers behind the gateway: registry, capability labels, health, breakers, client,
routing policies.

``WorkerRegistry.add`` connects a :class:`WorkerClient` (the worker protocol's), reads
what the worker says of itself into labels, and keeps a :class:`Worker` per URL; the
:class:`HealthChecker` keeps ``healthy`` current; a policy picks among
``registry.available(role, model_id)``.
"""

from tandem.gateway.workers.breaker import CircuitBreaker
from tandem.gateway.workers.health import HealthChecker
from tandem.gateway.workers.protocol import WorkerClient, WorkerStream
from tandem.gateway.workers.registry import WorkerRegistry, WorkerUnreachableError
from tandem.gateway.workers.worker import Worker

__all__ = [
    "CircuitBreaker",
    "HealthChecker",
    "Worker",
    "WorkerClient",
    "WorkerRegistry",
    "WorkerStream",
    "WorkerUnreachableError",
]
