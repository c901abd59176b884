"""One worker behind the gateway, and what its labels say it can do.

Labels come from the worker's own ``GetModelInfo`` / ``GetServerInfo`` answers
(see :mod:`.labels`); every capability check reads them here, so the rules of
docs/pd-contract.md §2 live in one place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from tandem.gateway.workers.breaker import CircuitBreaker
from tandem.wire.worker_marker import TANDEM_WORKER_LABEL

# "encode": an E/P/D encode worker (TokenSpeed), which only runs the vision tower.
WorkerRole = Literal["regular", "prefill", "decode", "encode"]
ROLES: tuple[WorkerRole, ...] = get_args(WorkerRole)

SUPPORTS_VISION_LABEL = "supports_vision"
MM_PROCESSOR_LABEL = "mm_processor"
MM_MEDIA_REF_SCHEMES_LABEL = "mm_media_ref_schemes"
KV_CONNECTOR_LABEL = "kv_connector"
DEVICE_NORMALIZE_LABEL = "mm_device_do_normalize"
SHM_NAMESPACE_LABEL = "shm_namespace_id"


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """What a worker's engine reported of its queue at the last health check (``GetLoads``):
    every gateway's requests, where ``Worker.in_flight`` counts this gateway's only."""

    running: int
    waiting: int


@dataclass(slots=True)
class Worker:
    url: str  # "host:port" of the worker's gRPC server
    role: WorkerRole
    labels: dict[str, str]
    model_id: str
    healthy: bool = True
    in_flight: int = 0  # requests the gateway has open on this worker (policies read it)
    breaker: CircuitBreaker = field(default_factory=CircuitBreaker)
    engine_load: EngineLoad | None = None  # None: not reported (or the last check failed)

    @property
    def load(self) -> int:
        """Requests on this worker as load-aware policies count them: this gateway's own
        (exact, now) or the engine's reported queue (all gateways', one interval old),
        whichever is more."""
        reported = self.engine_load
        if reported is None:
            return self.in_flight
        return max(self.in_flight, reported.running + reported.waiting)

    @property
    def supports_vision(self) -> bool:
        # Tri-state label: absent means capable (older servicers, other runtimes).
        return self.labels.get(SUPPORTS_VISION_LABEL) != "false"

    @property
    def language_model_only(self) -> bool:
        """The worker said it has no vision encoder (``supports_vision="false"``)."""
        return self.labels.get(SUPPORTS_VISION_LABEL) == "false"

    @property
    def accepts_media_refs(self) -> bool:
        """A non-empty ``mm_processor`` is the worker's promise to take ``media_refs``."""
        return bool(self.labels.get(MM_PROCESSOR_LABEL))

    @property
    def enforces_tandem_media_policy(self) -> bool:
        """A Tandem worker: it fetches ``media_refs`` URLs under Tandem's media guard.

        Any other worker (vLLM) may follow a redirect or a re-resolved name to an address
        the gateway refuses, so it is sent only ``data:`` URLs (docs/operations.md).
        """
        return bool(self.labels.get(TANDEM_WORKER_LABEL))

    @property
    def media_ref_schemes(self) -> frozenset[str]:
        raw = self.labels.get(MM_MEDIA_REF_SCHEMES_LABEL, "")
        return frozenset(s.strip().lower() for s in raw.split(",") if s.strip())

    @property
    def device_normalizes(self) -> bool:
        """The worker rescales/normalizes pixels in the model: it needs raw uint8 pixels."""
        return self.labels.get(DEVICE_NORMALIZE_LABEL) == "true"

    @property
    def shm_namespace_id(self) -> str:
        """``<boot_id>:<st_dev of /dev/shm>`` of the worker ("" if it reads no shared memory)."""
        return self.labels.get(SHM_NAMESPACE_LABEL, "")

    @property
    def kv_connector(self) -> str:
        """The KV connector name ("" when the worker has none)."""
        return self.labels.get(KV_CONNECTOR_LABEL, "")

    @property
    def available(self) -> bool:
        """Healthy and the breaker lets traffic through (does not claim a half-open probe)."""
        return self.healthy and self.breaker.can_attempt()
