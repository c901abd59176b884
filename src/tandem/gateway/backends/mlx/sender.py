"""Starting an MLX leg on one worker: no pixels, no transport of its own, one call per
sample (``client.py``)."""

from __future__ import annotations

from tandem.gateway import metrics
from tandem.gateway.backends.mlx.client import MlxClient
from tandem.gateway.backends.mlx.leg import MlxLeg
from tandem.gateway.workers.protocol import WorkerClient, WorkerStream
from tandem.gateway.workers.worker import Worker
from tandem.wire.pixels import PixelPayload


class MlxSender:
    """The :class:`~tandem.gateway.workers.protocol.LegSender` of MLX's protocol."""

    name = "mlx"

    def client(self, url: str) -> WorkerClient:
        return MlxClient(url)

    def start(
        self,
        client: WorkerClient,
        worker: Worker,
        leg: MlxLeg,
        timeout_s: float,
        pixels: PixelPayload | None,
    ) -> WorkerStream:
        return client.generate(leg, timeout=timeout_s, pixels=pixels)

    def rename(self, leg: MlxLeg, request_id: str) -> None:
        """The samples' ids follow (``{id}-{i}``): they are derived when sent."""
        leg.request.request_id = request_id

    def record_leg(self, role: str, leg: MlxLeg, pixels: PixelPayload | None = None) -> None:
        """``tandem_mm_tensor_bytes_total{leg, kind}``: always 0 here (no media), counted so
        that every protocol's series exist alike."""
        metrics.MM_TENSOR_BYTES.labels(role, "pixel").inc(0)
        metrics.MM_TENSOR_BYTES.labels(role, "other").inc(0)

    def close(self) -> None:
        """Nothing outlives a call."""
