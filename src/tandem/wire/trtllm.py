"""TensorRT-LLM's wire contract (``trtllm.TrtllmService``), shared by both sides.

The generated modules of the pinned ``smg-grpc-proto`` package and the names both sides
dial. The protocol carries text and images as their source bytes (``MultimodalInput``:
the engine processes them itself) and no PD pairing a gateway can relay: its answers
return no context-phase parameters (docs/worker-protocols.md). Only the TensorRT-LLM
folders (``gateway/backends/trtllm``, ``worker/trtllm``) import this module
(tests/unit/test_protocol_boundary.py).
"""

from __future__ import annotations

from smg_grpc_proto.generated import trtllm_service_pb2 as trpb
from smg_grpc_proto.generated import trtllm_service_pb2_grpc as trpb_grpc

__all__ = [
    "GENERATE_METHOD",
    "GET_SERVER_INFO_METHOD",
    "HEALTHY_STATUS",
    "SERVICE_NAME",
    "trpb",
    "trpb_grpc",
]

SERVICE_NAME = "trtllm.TrtllmService"
GENERATE_METHOD = f"/{SERVICE_NAME}/Generate"
GET_SERVER_INFO_METHOD = f"/{SERVICE_NAME}/GetServerInfo"
# HealthCheck answers a status string; this one (trimmed, any case) means healthy.
HEALTHY_STATUS = "ok"


def status_is_healthy(status: str) -> bool:
    """Whether a ``HealthCheckResponse.status`` says healthy (smg's reading: "OK", trimmed,
    compared without case)."""
    return status.strip().lower() == HEALTHY_STATUS
