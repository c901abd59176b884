"""SGLang's wire contract (``sglang.grpc.scheduler.SglangScheduler``), shared by both sides.

The generated modules of the pinned ``smg-grpc-proto`` package, the tensor codec into
SGLang's ``TensorData`` (``data`` inline bytes, ``shape``, ``dtype``: no shared memory and
no remote payloads in this protocol) and the rendezvous a PD pair meets at. Only the SGLang
folders (``gateway/backends/sglang``, ``worker/sglang``) import this module
(tests/unit/test_protocol_boundary.py).
"""

from __future__ import annotations

import math

import numpy as np
from smg_grpc_proto.generated import sglang_scheduler_pb2 as spb
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as spb_grpc

from tandem.wire.dtypes import (
    WIRE_DTYPES,
    TensorCodecError,
    bfloat16_bits_to_float32,
    wire_payload,
)

SERVICE_NAME = "sglang.grpc.scheduler.SglangScheduler"
GENERATE_METHOD = f"/{SERVICE_NAME}/Generate"
GET_SERVER_INFO_METHOD = f"/{SERVICE_NAME}/GetServerInfo"

# SGLang's own default for --disaggregation-bootstrap-port, which smg also assumes when a
# prefill URL names no port (docs/worker-protocols.md).
DEFAULT_BOOTSTRAP_PORT = 8998
# Rooms are int32 on the wire; gateways mint them in [0, 2**31 - 1).
ROOM_LIMIT = (1 << 31) - 1


def room_transfer_id(request_id: str, room: int) -> str:
    """The KV a prefill leg holds for its decode leg, named by both legs alike.

    Both legs carry the same request id and the same room; a room alone is a random
    31-bit number, so two live requests could draw the same one.
    """
    return f"sglang:{request_id}:{room}"


def encode_into(target: spb.TensorData, array: np.ndarray, dtype: str | None = None) -> None:
    """``array`` inline into ``target`` in its wire layout (C order, little-endian)."""
    payload, wire = wire_payload(array, dtype)
    target.Clear()
    target.shape.extend(int(d) for d in array.shape)
    target.dtype = wire
    target.data = payload.tobytes()


def tensor_nbytes(tensor: spb.TensorData) -> int:
    """The payload's size as its shape and dtype state it (0 for an unknown dtype)."""
    if tensor.dtype not in WIRE_DTYPES:
        return 0
    return math.prod(int(d) for d in tensor.shape) * WIRE_DTYPES[tensor.dtype].itemsize


def decode_tensor(tensor: spb.TensorData) -> np.ndarray:
    """A read-only view of the message bytes (bfloat16 widened to float32).

    Refuses an unknown dtype and a payload whose length disagrees with its shape, rather
    than reading it as float32 the way some servicers do.
    """
    if tensor.dtype not in WIRE_DTYPES:
        raise TensorCodecError(
            f"unsupported TensorData dtype {tensor.dtype!r}; expected one of "
            f"{', '.join(WIRE_DTYPES)}"
        )
    shape = [int(d) for d in tensor.shape]
    want = tensor_nbytes(tensor)
    if len(tensor.data) != want:
        raise TensorCodecError(
            f"TensorData byte length mismatch for dtype={tensor.dtype}, shape={shape}: "
            f"expected {want}, got {len(tensor.data)}"
        )
    try:
        view = np.frombuffer(tensor.data, dtype=WIRE_DTYPES[tensor.dtype]).reshape(shape)
    except ValueError as exc:
        raise TensorCodecError(f"TensorData shape {shape} cannot be represented: {exc}") from None
    if tensor.dtype == "bfloat16":
        return bfloat16_bits_to_float32(view)
    return view


__all__ = [
    "DEFAULT_BOOTSTRAP_PORT",
    "GENERATE_METHOD",
    "GET_SERVER_INFO_METHOD",
    "ROOM_LIMIT",
    "SERVICE_NAME",
    "decode_tensor",
    "encode_into",
    "room_transfer_id",
    "spb",
    "spb_grpc",
    "tensor_nbytes",
]
