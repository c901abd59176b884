"""Count what each PD leg brings to this worker: message bytes and pixel bytes.

Every worker uses it, so that benchmarks and compatibility tests read bytes on the wire at
the worker, whichever gateway sent them. The counters join the worker's
``tandem.kv.KvTransfer/Stats`` answer as ``leg_bytes``.
"""

from __future__ import annotations

from typing import Any

import grpc

from tandem.wire.kv_params import request_kv_params
from tandem.wire.proto import pb
from tandem.wire.requests import mm_batches
from tandem.wire.tensors import tensor_nbytes
from tandem.worker.vllm.servicer import WorkerServicer


def leg_of(request: pb.GenerateRequest) -> str:
    """``prefill``, ``decode`` or ``aggregated``, from the request's KV transfer params."""
    try:
        params = request_kv_params(request) or {}
    except ValueError:
        return "aggregated"
    if params.get("do_remote_decode"):
        return "prefill"
    if params.get("do_remote_prefill"):
        return "decode"
    return "aggregated"


def pixel_bytes(request: pb.GenerateRequest) -> int:
    return sum(
        tensor_nbytes(batch.pixel_values)
        for batch in mm_batches(request)
        if batch.HasField("pixel_values")
    )


def shm_bytes(request: pb.GenerateRequest) -> int:
    """Tensor bytes that came as shared-memory handles instead of inside the message."""
    total = 0
    for batch in mm_batches(request):
        tensors = [*batch.model_specific_tensors.values()]
        if batch.HasField("pixel_values"):
            tensors.append(batch.pixel_values)
        total += sum(tensor_nbytes(t) for t in tensors if t.WhichOneof("payload") == "shm")
    return total


class CountingServicer(WorkerServicer):
    """The servicer, plus per-leg counts of requests, message bytes and pixel bytes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.legs: dict[str, dict[str, int]] = {}

    async def Generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext):
        counts = self.legs.setdefault(
            leg_of(request), {"requests": 0, "message_bytes": 0, "pixel_bytes": 0, "shm_bytes": 0}
        )
        counts["requests"] += 1
        counts["message_bytes"] += request.ByteSize()
        counts["pixel_bytes"] += pixel_bytes(request)
        counts["shm_bytes"] += shm_bytes(request)
        async for response in super().Generate(request, context):
            yield response

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "leg_bytes": {k: dict(v) for k, v in self.legs.items()}}
