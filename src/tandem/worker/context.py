"""What a protocol adapter's servicer is built from, and what the process asks of it.

The process (``worker/server.py``) builds the engine, the KV side-channel client and the
gRPC server; each protocol's adapter (``worker/<protocol>/adapter.py``, chosen in
``worker/adapters.py``) puts its service on that server from this context alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tandem.engine.image_encoder import ImageEncoder
from tandem.engine.protocol import Engine
from tandem.models.info import ModelInfo
from tandem.worker.config import WorkerConfig
from tandem.worker.kv_channel import KvChannelClient
from tandem.worker.kv_events.publisher import KvEventPublisher
from tandem.worker.kv_events.stream import ClearableCache


@dataclass(frozen=True, slots=True)
class WorkerContext:
    config: WorkerConfig
    model_dir: Path
    model: ModelInfo
    engine: Engine
    kv_client: KvChannelClient
    # (host, port) others dial for this worker's gRPC service and KV: the advertised host,
    # never the bind address (docs/operations.md, "Addresses").
    advertised: tuple[str, int]
    # Where SGLang decode legs reach this worker's KV: --disaggregation-bootstrap-port, or
    # the gRPC port when it is not given.
    bootstrap_port: int
    # --role encode: the vision tower on its own thread (E/P/D), built by the process from
    # the embedded engine's model; None on every other role.
    image_encoder: ImageEncoder | None = None
    # The engine's prefix cache (FlushCache clears it) and the process's one KV-event
    # publisher over it (``worker/kv_events``); None with --no-kv-events.
    prefix_cache: ClearableCache | None = None
    kv_events: KvEventPublisher | None = None


class ServedProtocol(Protocol):
    """The servicer an adapter put on the server, as the process uses it."""

    def stats(self) -> dict[str, Any]:
        """The worker's counters for the side channel's Stats call."""
        ...
