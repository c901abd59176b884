"""MLX's wire contract (``mlx.grpc.engine.MlxEngine``), shared by both sides.

The generated modules of the pinned ``smg-grpc-proto`` package and the names both sides
dial. The protocol carries tokenized text only: no media, no constraint, no PD, one
sample per request, and its answers name no request id (docs/worker-protocols.md). Only
the MLX folders (``gateway/backends/mlx``, ``worker/mlx``) import this module
(tests/unit/test_protocol_boundary.py).
"""

from __future__ import annotations

from smg_grpc_proto.generated import mlx_engine_pb2 as mpb
from smg_grpc_proto.generated import mlx_engine_pb2_grpc as mpb_grpc

__all__ = ["GENERATE_METHOD", "GET_SERVER_INFO_METHOD", "SERVICE_NAME", "mpb", "mpb_grpc"]

SERVICE_NAME = "mlx.grpc.engine.MlxEngine"
GENERATE_METHOD = f"/{SERVICE_NAME}/Generate"
GET_SERVER_INFO_METHOD = f"/{SERVICE_NAME}/GetServerInfo"
# The most alternatives per token the real MLX servicer returns (smg caps chat's there).
MAX_TOP_LOGPROBS = 20
