"""Starting an SGLang leg on one worker: the pixels normalized and spliced in, inline."""

from __future__ import annotations

from tandem.gateway import metrics
from tandem.gateway.backends.sglang.client import SglangClient
from tandem.gateway.workers.protocol import Leg, WorkerClient, WorkerStream
from tandem.gateway.workers.worker import Worker
from tandem.wire.pixels import PixelPayload
from tandem.wire.sglang import tensor_nbytes


class SglangSender:
    """The :class:`~tandem.gateway.workers.protocol.LegSender` of SGLang's protocol."""

    name = "sglang"

    def client(self, url: str) -> WorkerClient:
        return SglangClient(url)

    def start(
        self,
        client: WorkerClient,
        worker: Worker,
        leg: Leg,
        timeout_s: float,
        pixels: PixelPayload | None,
    ) -> WorkerStream:
        """SGLang workers take normalized pixels (callers pass raw ones through
        ``dispatch.streams.worker_pixels`` first, off the loop; this is the fallback)."""
        if pixels is not None:
            pixels = pixels.for_worker(False)
        return client.generate(leg, timeout=timeout_s, pixels=pixels)

    def rename(self, leg: Leg, request_id: str) -> None:
        leg.request_id = request_id

    def record_leg(self, role: str, leg: Leg, pixels: PixelPayload | None = None) -> None:
        """``tandem_mm_tensor_bytes_total{leg, kind}``: the pixels beside the message (or in
        it), and the model's other tensors."""
        pixel = pixels.total_nbytes if pixels is not None else 0
        other = 0
        if leg.HasField("mm_inputs"):
            batch = leg.mm_inputs
            if batch.HasField("pixel_values"):
                pixel += tensor_nbytes(batch.pixel_values)
            other = sum(tensor_nbytes(t) for t in batch.model_specific_tensors.values())
        metrics.MM_TENSOR_BYTES.labels(role, "pixel").inc(pixel)
        metrics.MM_TENSOR_BYTES.labels(role, "other").inc(other)

    def close(self) -> None:
        """Nothing outlives a call: SGLang tensors travel inline."""
