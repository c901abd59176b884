"""Starting a TensorRT-LLM leg on one worker: the message as it is (its images are source
bytes inside it; no pixels travel beside it)."""

from __future__ import annotations

from tandem.gateway import metrics
from tandem.gateway.backends.trtllm.client import TrtllmClient
from tandem.gateway.workers.protocol import Leg, WorkerClient, WorkerStream
from tandem.gateway.workers.worker import Worker
from tandem.wire.pixels import PixelPayload


class TrtllmSender:
    """The :class:`~tandem.gateway.workers.protocol.LegSender` of TensorRT-LLM's protocol."""

    name = "trtllm"

    def client(self, url: str) -> WorkerClient:
        return TrtllmClient(url)

    def start(
        self,
        client: WorkerClient,
        worker: Worker,
        leg: Leg,
        timeout_s: float,
        pixels: PixelPayload | None,
    ) -> WorkerStream:
        # The backend never leaves pixels beside a leg; the client refuses any.
        return client.generate(leg, timeout=timeout_s, pixels=pixels)

    def rename(self, leg: Leg, request_id: str) -> None:
        leg.request_id = request_id

    def record_leg(self, role: str, leg: Leg, pixels: PixelPayload | None = None) -> None:
        """``tandem_mm_tensor_bytes_total{leg, kind}``: these legs carry no tensors (the
        images are encoded source bytes), so both kinds stay at 0 for them."""
        metrics.MM_TENSOR_BYTES.labels(role, "pixel").inc(0)
        metrics.MM_TENSOR_BYTES.labels(role, "other").inc(0)

    def close(self) -> None:
        """Nothing outlives a call."""
