"""Measure what each leg carries: pixel bytes versus other tensor bytes.

Read from the tensors' shapes and dtypes, so measuring never copies a payload.
"""

from __future__ import annotations

from dataclasses import dataclass

from tandem.gateway import metrics
from tandem.wire.pixels import PixelPayload
from tandem.wire.proto import GenerateRequest
from tandem.wire.requests import mm_batches
from tandem.wire.tensors import tensor_nbytes


@dataclass(frozen=True, slots=True)
class LegBytes:
    pixel: int
    other: int


def leg_bytes(request: GenerateRequest, pixels: PixelPayload | None = None) -> LegBytes:
    """Tensor bytes of a leg; ``pixels`` are the payload sent beside the message, if any."""
    pixel = pixels.total_nbytes if pixels is not None else 0
    other = 0
    for batch in mm_batches(request):
        if batch.HasField("pixel_values"):
            pixel += tensor_nbytes(batch.pixel_values)
        other += sum(tensor_nbytes(t) for t in batch.model_specific_tensors.values())
    return LegBytes(pixel, other)


def record_leg(leg: str, request: GenerateRequest, pixels: PixelPayload | None = None) -> LegBytes:
    """Count the leg's tensor bytes in ``tandem_mm_tensor_bytes_total{leg, kind}``."""
    sizes = leg_bytes(request, pixels)
    metrics.child(metrics.MM_TENSOR_BYTES, leg, "pixel").inc(sizes.pixel)
    metrics.child(metrics.MM_TENSOR_BYTES, leg, "other").inc(sizes.other)
    return sizes
