"""Starting a vLLM leg on one worker: its pixels in the form and over the transport it takes."""

from __future__ import annotations

from tandem.gateway.backends.vllm.client import VllmClient
from tandem.gateway.backends.vllm.leg_bytes import record_leg
from tandem.gateway.backends.vllm.tensor_transport import TensorTransport
from tandem.gateway.workers.protocol import Leg, WorkerClient, WorkerStream
from tandem.gateway.workers.worker import Worker
from tandem.wire.pixels import PixelPayload
from tandem.wire.requests import has_mm_inputs


class VllmSender:
    """The :class:`~tandem.gateway.workers.protocol.LegSender` of vLLM's protocol."""

    name = "vllm"

    def __init__(self, transport: TensorTransport | None = None, stream_client: str = "h2") -> None:
        # How legs' tensors travel (--multimodal-tensor-transport).
        self.transport = transport if transport is not None else TensorTransport()
        self.stream_client = stream_client  # --worker-stream-client

    def client(self, url: str) -> WorkerClient:
        return VllmClient(url, h2_streams=self.stream_client == "h2")

    def start(
        self,
        client: WorkerClient,
        worker: Worker,
        leg: Leg,
        timeout_s: float,
        pixels: PixelPayload | None,
    ) -> WorkerStream:
        """Raw pixels are normalized here for a worker that does not normalize on device
        (callers with pixels pass them through ``dispatch.streams.worker_pixels`` first, off
        the loop). The leg's shared-memory segments, if any, live until its call ends."""
        if pixels is None and not has_mm_inputs(leg):
            return client.generate(leg, timeout=timeout_s)
        if pixels is not None:
            pixels = pixels.for_worker(worker.device_normalizes)
        outgoing = self.transport.prepare(worker, leg, pixels)
        try:
            release = outgoing.release if outgoing.segments else None
            return client.generate(
                outgoing.request, timeout=timeout_s, pixels=outgoing.pixels, on_done=release
            )
        except BaseException:
            outgoing.release()
            raise

    def rename(self, leg: Leg, request_id: str) -> None:
        leg.request_id = request_id

    def record_leg(self, role: str, leg: Leg, pixels: PixelPayload | None = None) -> None:
        record_leg(role, leg, pixels)

    def close(self) -> None:
        self.transport.close()
