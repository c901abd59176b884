"""Count what each request brings this worker: requests, message bytes, pixel bytes.

As the other adapters' counters do, so that benchmarks and compatibility tests read the
bytes on the wire at the worker whichever gateway sent them (the worker's
``tandem.kv.KvTransfer/Stats`` answer, ``leg_bytes``). Every MLX request is a whole one
(``aggregated``); pixel and shared-memory bytes are always 0 (the protocol carries no media),
kept so that every protocol's counters read alike.
"""

from __future__ import annotations

from typing import Any

import grpc

from tandem.wire.mlx import mpb
from tandem.worker.mlx.servicer import MlxServicer


class CountingMlxServicer(MlxServicer):
    """The servicer, plus counts of requests and message bytes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.legs: dict[str, dict[str, int]] = {}

    async def Generate(self, request: mpb.GenerateRequest, context: grpc.aio.ServicerContext):
        counts = self.legs.setdefault(
            "aggregated", {"requests": 0, "message_bytes": 0, "pixel_bytes": 0, "shm_bytes": 0}
        )
        counts["requests"] += 1
        counts["message_bytes"] += request.ByteSize()
        async for response in super().Generate(request, context):
            yield response

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "leg_bytes": {k: dict(v) for k, v in self.legs.items()}}
