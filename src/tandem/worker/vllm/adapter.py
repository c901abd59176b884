"""The worker's vLLM service on a gRPC server: what ``worker/server.py`` calls."""

from __future__ import annotations

import grpc

from tandem.wire.proto import pb_grpc
from tandem.worker.vllm.leg_counter import CountingServicer


def add_vllm_service(servicer: CountingServicer, server: grpc.aio.Server) -> None:
    """Serve ``vllm.grpc.engine.VllmEngine`` through ``servicer`` on ``server``."""
    pb_grpc.add_VllmEngineServicer_to_server(servicer, server)
