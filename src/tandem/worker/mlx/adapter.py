"""The worker's MLX service on a gRPC server: what ``worker/adapters.py`` calls.

MLX's protocol has no PD legs, so the worker serves ``--role both`` only (``worker/config.py``
refuses the others). The KV side channel the process adds to the same server holds nothing
here (no prefill KV to hand over); its ``Stats`` call reports this servicer's counters.
"""

from __future__ import annotations

import grpc

from tandem.wire.mlx import GET_SERVER_INFO_METHOD, mpb_grpc
from tandem.worker.context import WorkerContext
from tandem.worker.mlx.leg_counter import CountingMlxServicer

SERVER_INFO_METHOD = GET_SERVER_INFO_METHOD


def serve(context: WorkerContext, server: grpc.aio.Server) -> CountingMlxServicer:
    """Serve ``mlx.grpc.engine.MlxEngine`` on ``server``; the servicer, for its stats."""
    servicer = CountingMlxServicer(context.config, context.model, context.engine)
    mpb_grpc.add_MlxEngineServicer_to_server(servicer, server)
    return servicer
