"""How a leg's tensors travel: inline in the message, or as same-host shared memory.

``--multimodal-tensor-transport`` (docs/operations.md, "Shared-memory tensor transport";
rules in docs/pd-contract.md §17a):

- ``inline``: every tensor inside the gRPC message;
- ``shm``: tensors of at least ``--multimodal-shm-min-bytes`` go into a ``/dev/shm``
  segment whenever /dev/shm is writable here; the worker must be on this host;
- ``auto``: as ``shm``, but only for a worker whose ``shm_namespace_id`` label equals the
  gateway's own (same boot, same /dev/shm), inline for every other worker.

Only a leg that carries pixels uses segments, and M-RoPE grid tensors always stay inline:
a segment is unlinked by the worker that reads it, so a decode leg built from the same
request must find every tensor it keeps inline. Each leg gets fresh segments; they are
unlinked when the leg's call ends, read or not (the worker normally unlinked them already).
A failed write falls back to inline and is counted.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from tandem.gateway import metrics
from tandem.gateway.types import TENSOR_TRANSPORT_MODES, TensorTransportMode
from tandem.gateway.workers.worker import Worker
from tandem.wire.pixels import PixelPayload
from tandem.wire.proto import GRID_KEYS, GenerateRequest, TensorData
from tandem.wire.requests import mm_batches
from tandem.wire.shm import Segment, SegmentWriter, shm_namespace_id

log = logging.getLogger("tandem.gateway.workers")

DEFAULT_SHM_MIN_BYTES = 64 << 10  # GatewayConfig.mm_shm_min_bytes


@dataclass(slots=True)
class OutgoingLeg:
    """What one leg sends, and the segments to unlink once its call is over."""

    request: GenerateRequest
    pixels: PixelPayload | None
    segments: list[Segment] = field(default_factory=list)
    writer: SegmentWriter | None = None

    def release(self) -> None:
        """Unlink this leg's segments (idempotent; already-unlinked ones are fine)."""
        segments, self.segments = self.segments, []
        if segments and self.writer is not None:
            self.writer.release(segments)


class TensorTransport:
    """The gateway's choice of tensor path per leg, and the writer of its segments."""

    def __init__(
        self,
        mode: TensorTransportMode = "inline",
        min_bytes: int = DEFAULT_SHM_MIN_BYTES,
        *,
        writer: SegmentWriter | None = None,
        namespace_id: str | None = None,
    ) -> None:
        if mode not in TENSOR_TRANSPORT_MODES:
            raise ValueError(f"tensor transport must be one of {', '.join(TENSOR_TRANSPORT_MODES)}")
        self.mode = mode
        self.min_bytes = max(1, min_bytes)
        self.writer = writer if writer is not None else SegmentWriter()
        if namespace_id is None:
            namespace_id = shm_namespace_id() if mode == "auto" else ""
        self.namespace_id = namespace_id
        self.enabled = mode != "inline" and self.writer.writable()
        if mode != "inline" and not self.enabled:
            log.warning(
                "--multimodal-tensor-transport %s: %s is not writable; tensors go inline",
                mode,
                self.writer.shm_dir,
            )

    def uses_shm(self, worker: Worker) -> bool:
        if not self.enabled:
            return False
        if self.mode == "shm":
            return True
        return bool(self.namespace_id) and worker.shm_namespace_id == self.namespace_id

    def prepare(
        self, worker: Worker, request: GenerateRequest, pixels: PixelPayload | None
    ) -> OutgoingLeg:
        """The leg as it goes to ``worker``; ``request`` itself is never modified."""
        leg = OutgoingLeg(request, pixels, writer=self.writer)
        if pixels is not None and self.uses_shm(worker):
            self._to_shm(leg)
        _count(leg)
        return leg

    def close(self) -> None:
        """Unlink what no call released (the gateway is stopping)."""
        self.writer.close()

    def _to_shm(self, leg: OutgoingLeg) -> None:
        pixels = leg.pixels
        assert pixels is not None
        if pixels.nbytes >= self.min_bytes:
            segment = self._write(pixels.array.data, pixels.nbytes)
            if segment is not None:
                leg.segments.append(segment)
                leg.pixels = pixels.in_shm(segment.handle)
        big = [
            (index, key)
            for index, batch in enumerate(mm_batches(leg.request))
            for key, tensor in batch.model_specific_tensors.items()
            if key not in GRID_KEYS
            and tensor.WhichOneof("payload") == "inline"
            and len(tensor.inline) >= self.min_bytes
        ]
        if not big:
            return
        # A copy for this leg only: the request goes on describing the client's ask (and
        # feeds the decode leg, which keeps inline tensors only).
        copy = GenerateRequest()
        copy.CopyFrom(leg.request)
        batches = mm_batches(copy)
        for index, key in big:
            tensor = batches[index].model_specific_tensors[key]
            segment = self._write(tensor.inline, len(tensor.inline))
            if segment is not None:
                leg.segments.append(segment)
                tensor.shm.CopyFrom(segment.handle)  # the oneof drops the inline bytes
        leg.request = copy

    def _write(self, data: memoryview | bytes, nbytes: int) -> Segment | None:
        try:
            return self.writer.write([data], nbytes)
        except OSError as exc:
            metrics.MM_SHM_WRITE_FAILURES.inc()
            log.warning(
                "could not write a multimodal tensor to shared memory (%s); sending it inline",
                exc,
            )
            return None


def _count(leg: OutgoingLeg) -> None:
    """``tandem_mm_tensors_total{path}`` and the bytes that went through shared memory."""
    inline = shm = shm_bytes = 0
    if leg.pixels is not None:
        if leg.pixels.shm is not None:
            shm, shm_bytes = 1, leg.pixels.nbytes
        else:
            inline = 1
    for batch in mm_batches(leg.request):
        tensors: list[TensorData] = [*batch.model_specific_tensors.values()]
        if batch.HasField("pixel_values"):
            tensors.append(batch.pixel_values)
        for tensor in tensors:
            if tensor.WhichOneof("payload") == "shm":
                shm += 1
                shm_bytes += int(tensor.shm.nbytes)
            else:
                inline += 1
    if inline:
        metrics.MM_TENSORS.labels("inline").inc(inline)
    if shm:
        metrics.MM_TENSORS.labels("shm").inc(shm)
        metrics.MM_SHM_BYTES.inc(shm_bytes)
