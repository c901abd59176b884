"""An encode worker's copy of ``TokenSpeedScheduler``: what gateways discover it by.

smg finds a worker's protocol by asking each protocol's ``HealthCheck`` in turn, then
reads its model and server info; an E/P/D encode worker (``--role encode``) must answer
those as TokenSpeed's do, or it is never registered. It generates nothing: ``Generate``
is FAILED_PRECONDITION, ``GetLoads`` has no ranks, the health check is shallow and the
server info says ``disaggregation_mode`` "encode". Its real service is
``TokenSpeedEncoder``, served beside this one (``adapter.py``).
"""

from __future__ import annotations

from typing import Any

import grpc

from tandem.wire.tokenspeed import tpb
from tandem.worker.tokenspeed.servicer import TokenSpeedServicer

GENERATE_UNAVAILABLE = "Generate is unavailable on TokenSpeed encode workers"


class EncodeDiscoveryServicer(TokenSpeedServicer):
    async def Generate(self, request: tpb.GenerateRequest, context: grpc.aio.ServicerContext):
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, GENERATE_UNAVAILABLE)
        yield tpb.GenerateResponse()  # never reached: makes this a streaming handler

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "leg_bytes": {}}
