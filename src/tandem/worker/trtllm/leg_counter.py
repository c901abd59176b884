"""Count what reaches this worker: requests, message bytes, image bytes.

As the other adapters' counters do, so that benchmarks and compatibility tests read the
bytes on the wire at the worker whichever gateway sent them; the counters join the
worker's ``tandem.kv.KvTransfer/Stats`` answer as ``leg_bytes``. The protocol has no PD
legs, so every request counts as ``aggregated``. ``pixel_bytes`` and ``shm_bytes`` are
always 0 (no pixel tensors come over this protocol; they are kept so that every
protocol's counters read alike); ``image_bytes`` is the images' source bytes.
"""

from __future__ import annotations

from typing import Any

import grpc

from tandem.wire.trtllm import trpb
from tandem.worker.trtllm.media import image_bytes
from tandem.worker.trtllm.servicer import TrtllmServicer

LEG = "aggregated"


class CountingTrtllmServicer(TrtllmServicer):
    """The servicer, plus counts of requests, message bytes and image bytes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.legs: dict[str, dict[str, int]] = {}

    async def Generate(self, request: trpb.GenerateRequest, context: grpc.aio.ServicerContext):
        counts = self.legs.setdefault(
            LEG,
            {"requests": 0, "message_bytes": 0, "pixel_bytes": 0, "shm_bytes": 0, "image_bytes": 0},
        )
        counts["requests"] += 1
        counts["message_bytes"] += request.ByteSize()
        counts["image_bytes"] += image_bytes(request)
        async for response in super().Generate(request, context):
            yield response

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "leg_bytes": {k: dict(v) for k, v in self.legs.items()}}
