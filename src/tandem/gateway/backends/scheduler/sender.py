"""Starting a leg of a scheduler protocol (SGLang, TokenSpeed) on one worker: the pixels
normalized (these workers do not normalize on device) and spliced in by the client, inline.
A protocol's sender adds its name, its client and its byte accounting."""

from __future__ import annotations

from tandem.gateway.workers.protocol import Leg, WorkerClient, WorkerStream
from tandem.gateway.workers.worker import Worker
from tandem.wire.pixels import PixelPayload


class SchedulerSender:
    """The shared half of a :class:`~tandem.gateway.workers.protocol.LegSender`."""

    def start(
        self,
        client: WorkerClient,
        worker: Worker,
        leg: Leg,
        timeout_s: float,
        pixels: PixelPayload | None,
    ) -> WorkerStream:
        """Callers pass raw pixels through ``dispatch.streams.worker_pixels`` first, off
        the loop; this is the fallback."""
        if pixels is not None:
            pixels = pixels.for_worker(False)
        return client.generate(leg, timeout=timeout_s, pixels=pixels)

    def rename(self, leg: Leg, request_id: str) -> None:
        leg.request_id = request_id

    def close(self) -> None:
        """Nothing outlives a call: these tensors travel inline."""
