"""The wire contract: generated modules of the pinned ``smg-grpc-proto`` package.

Tandem never forks the .proto; everything on the wire comes from these modules.
"""

from __future__ import annotations

from smg_grpc_proto.generated import common_pb2, vllm_engine_pb2, vllm_engine_pb2_grpc

pb = vllm_engine_pb2
pb_grpc = vllm_engine_pb2_grpc
common = common_pb2

GenerateRequest = pb.GenerateRequest
GenerateResponse = pb.GenerateResponse
GenerateComplete = pb.GenerateComplete
MultimodalInputs = pb.MultimodalInputs
TensorData = pb.TensorData
MediaIdentity = pb.MediaIdentity
Modality = common_pb2.Modality

SERVICE_NAME = "vllm.grpc.engine.VllmEngine"

# M-RoPE grid tensors: positional metadata the decode leg needs even without pixels.
GRID_KEYS: tuple[str, ...] = (
    "image_grid_thw",
    "video_grid_thw",
    "second_per_grid_ts",
    "video_second_per_grid",
)
