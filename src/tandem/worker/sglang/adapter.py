"""The worker's SGLang service on a gRPC server: what ``worker/adapters.py`` calls."""

from __future__ import annotations

import grpc

from tandem.wire.sglang import GET_SERVER_INFO_METHOD, spb_grpc
from tandem.worker.context import WorkerContext
from tandem.worker.sglang.leg_counter import CountingSglangServicer

SERVER_INFO_METHOD = GET_SERVER_INFO_METHOD


def serve(context: WorkerContext, server: grpc.aio.Server) -> CountingSglangServicer:
    """Serve ``sglang.grpc.scheduler.SglangScheduler`` on ``server``; the servicer, for its
    stats. The KV side channel the process adds to the same server is also what decode
    workers dial at this worker's bootstrap port."""
    servicer = CountingSglangServicer(
        context.config, context.model, context.engine, context.kv_client, context.bootstrap_port
    )
    spb_grpc.add_SglangSchedulerServicer_to_server(servicer, server)
    servicer.serve_kv_events(context.kv_events, context.prefix_cache)
    return servicer
