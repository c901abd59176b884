"""Starting a TokenSpeed leg on one worker: each item's pixels normalized and spliced in."""

from __future__ import annotations

from tandem.gateway import metrics
from tandem.gateway.backends.tokenspeed.client import TokenSpeedClient
from tandem.gateway.workers.protocol import Leg, WorkerClient, WorkerStream
from tandem.gateway.workers.worker import Worker
from tandem.wire.pixels import PixelPayload
from tandem.wire.tokenspeed import tensor_nbytes


class TokenSpeedSender:
    """The :class:`~tandem.gateway.workers.protocol.LegSender` of TokenSpeed's protocol."""

    name = "tokenspeed"

    def client(self, url: str) -> WorkerClient:
        return TokenSpeedClient(url)

    def start(
        self,
        client: WorkerClient,
        worker: Worker,
        leg: Leg,
        timeout_s: float,
        pixels: PixelPayload | None,
    ) -> WorkerStream:
        """TokenSpeed workers take normalized pixels (callers pass raw ones through
        ``dispatch.streams.worker_pixels`` first, off the loop; this is the fallback)."""
        if pixels is not None:
            pixels = pixels.for_worker(False)
        return client.generate(leg, timeout=timeout_s, pixels=pixels)

    def rename(self, leg: Leg, request_id: str) -> None:
        leg.request_id = request_id

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

    def close(self) -> None:
        """Nothing outlives a call: TokenSpeed tensors travel inline here."""
