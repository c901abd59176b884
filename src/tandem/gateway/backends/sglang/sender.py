"""Starting an SGLang leg on one worker: the pixels normalized and spliced in, inline."""

from __future__ import annotations

from tandem.gateway import metrics
from tandem.gateway.backends.scheduler.sender import SchedulerSender
from tandem.gateway.backends.sglang.client import SglangClient
from tandem.gateway.workers.protocol import Leg, WorkerClient
from tandem.wire.pixels import PixelPayload
from tandem.wire.sglang import tensor_nbytes


class SglangSender(SchedulerSender):
    """The :class:`~tandem.gateway.workers.protocol.LegSender` of SGLang's protocol."""

    name = "sglang"

    def client(self, url: str) -> WorkerClient:
        return SglangClient(url)

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
