"""Starting a TokenSpeed leg on one worker: each item's pixels normalized and spliced in."""

from __future__ import annotations

from tandem.gateway import metrics
from tandem.gateway.backends.scheduler.sender import SchedulerSender
from tandem.gateway.backends.tokenspeed.client import TokenSpeedClient
from tandem.gateway.workers.protocol import Leg, WorkerClient
from tandem.wire.pixels import PixelPayload
from tandem.wire.tokenspeed import tensor_nbytes


class TokenSpeedSender(SchedulerSender):
    """The :class:`~tandem.gateway.workers.protocol.LegSender` of TokenSpeed's protocol."""

    name = "tokenspeed"

    def client(self, url: str) -> WorkerClient:
        return TokenSpeedClient(url)

    def record_leg(self, role: str, leg: Leg, pixels: PixelPayload | None = None) -> None:
        """``tandem_mm_tensor_bytes_total{leg, kind}``: the pixels beside the message (or in
        its items), and the items' other tensors."""
        pixel = pixels.total_nbytes if pixels is not None else 0
        other = 0
        for item in leg.mm_inputs.items:
            if item.HasField("encoder_input"):
                pixel += tensor_nbytes(item.encoder_input)
            other += sum(tensor_nbytes(t) for t in item.model_specific_tensors.values())
        metrics.MM_TENSOR_BYTES.labels(role, "pixel").inc(pixel)
        metrics.MM_TENSOR_BYTES.labels(role, "other").inc(other)
