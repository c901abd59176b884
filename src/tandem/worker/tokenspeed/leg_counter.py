"""Count what each PD leg brings to this worker: requests, message bytes, pixel bytes.

As the other adapters' counters do, so that benchmarks and compatibility tests read the
bytes on the wire at the worker whichever gateway sent them; the counters join the
worker's ``tandem.kv.KvTransfer/Stats`` answer as ``leg_bytes``. Both TokenSpeed PD legs
carry the same ``kv_bootstrap_info``: the worker's role says which leg a request is.
``pixel_bytes`` is the items' ``encoder_input`` bytes (0 on a decode leg sent without
them, as gateways send it).
"""

from __future__ import annotations

from typing import Any

import grpc

from tandem.wire.tokenspeed import tpb
from tandem.worker.tokenspeed.bootstrap import leg_of
from tandem.worker.tokenspeed.media import pixel_bytes
from tandem.worker.tokenspeed.servicer import TokenSpeedServicer


class CountingTokenSpeedServicer(TokenSpeedServicer):
    """The servicer, plus per-leg counts of requests, message bytes and pixel bytes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.legs: dict[str, dict[str, int]] = {}

    async def Generate(self, request: tpb.GenerateRequest, context: grpc.aio.ServicerContext):
        counts = self.legs.setdefault(
            leg_of(request, self.config.role),
            # shm_bytes: always 0 (this worker takes inline tensors only), kept so that
            # every protocol's counters read alike.
            {"requests": 0, "message_bytes": 0, "pixel_bytes": 0, "shm_bytes": 0},
        )
        counts["requests"] += 1
        counts["message_bytes"] += request.ByteSize()
        counts["pixel_bytes"] += pixel_bytes(request)
        async for response in super().Generate(request, context):
            yield response

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "leg_bytes": {k: dict(v) for k, v in self.legs.items()}}
