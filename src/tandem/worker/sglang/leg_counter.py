"""Count what each PD leg brings to this worker: requests, message bytes, pixel bytes.

As the vLLM adapter's counter does, so that benchmarks and compatibility tests read the
bytes on the wire at the worker whichever gateway sent them; the counters join the
worker's ``tandem.kv.KvTransfer/Stats`` answer as ``leg_bytes``. Both SGLang PD legs carry
the same ``disaggregated_params``: the worker's role says which leg a request is.
"""

from __future__ import annotations

from typing import Any

import grpc

from tandem.wire.sglang import spb, tensor_nbytes
from tandem.worker.sglang.bootstrap import leg_of
from tandem.worker.sglang.media import has_pixels
from tandem.worker.sglang.servicer import SglangServicer


def pixel_bytes(request: spb.GenerateRequest) -> int:
    return tensor_nbytes(request.mm_inputs.pixel_values) if has_pixels(request) else 0


class CountingSglangServicer(SglangServicer):
    """The servicer, plus per-leg counts of requests, message bytes and pixel bytes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.legs: dict[str, dict[str, int]] = {}

    async def Generate(self, request: spb.GenerateRequest, context: grpc.aio.ServicerContext):
        counts = self.legs.setdefault(
            leg_of(request, self.config.role),
            # shm_bytes: always 0 (SGLang's tensors are inline), kept so that both
            # protocols' counters read alike.
            {"requests": 0, "message_bytes": 0, "pixel_bytes": 0, "shm_bytes": 0},
        )
        counts["requests"] += 1
        counts["message_bytes"] += request.ByteSize()
        counts["pixel_bytes"] += pixel_bytes(request)
        async for response in super().Generate(request, context):
            yield response

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "leg_bytes": {k: dict(v) for k, v in self.legs.items()}}
