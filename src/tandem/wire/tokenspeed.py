"""TokenSpeed's wire contract (``tokenspeed.grpc.scheduler.TokenSpeedScheduler`` and
``tokenspeed.grpc.encoder.TokenSpeedEncoder``), shared by both sides.

The generated modules of the pinned ``smg-grpc-proto`` package, the tensor codec into
TokenSpeed's ``TensorData`` (``shape=1, dtype=2``, payload oneof ``inline=3``: the numbers
differ from vLLM's and SGLang's), the per-item media identity (``content_hash``) and the
rendezvous names a PD pair and an E/P/D item meet at (docs/worker-protocols.md). Only the
TokenSpeed folders (``gateway/backends/tokenspeed``, ``worker/tokenspeed``) import this
module (tests/unit/test_protocol_boundary.py).
"""

from __future__ import annotations

import math

import numpy as np
from blake3 import blake3
from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.generated import tokenspeed_encoder_pb2 as epb
from smg_grpc_proto.generated import tokenspeed_encoder_pb2_grpc as epb_grpc
from smg_grpc_proto.generated import tokenspeed_scheduler_pb2 as tpb
from smg_grpc_proto.generated import tokenspeed_scheduler_pb2_grpc as tpb_grpc

from tandem.wire.dtypes import (
    WIRE_DTYPES,
    TensorCodecError,
    bfloat16_bits_to_float32,
    wire_payload,
)

SERVICE_NAME = "tokenspeed.grpc.scheduler.TokenSpeedScheduler"
GENERATE_METHOD = f"/{SERVICE_NAME}/Generate"
GET_SERVER_INFO_METHOD = f"/{SERVICE_NAME}/GetServerInfo"
ENCODER_SERVICE_NAME = "tokenspeed.grpc.encoder.TokenSpeedEncoder"

# TokenSpeed's default bootstrap port (the same as SGLang's), which a gateway assumes when
# a --prefill or --encode URL names none.
DEFAULT_BOOTSTRAP_PORT = 8998
# Rooms are int64 on the wire; gateways mint them in [0, 2**63 - 1).
ROOM_LIMIT = (1 << 63) - 1

# Modalities as the common enum numbers them, and back.
IMAGE = common_pb2.IMAGE
VIDEO = common_pb2.VIDEO
AUDIO = common_pb2.AUDIO
MODALITY_UNSPECIFIED = common_pb2.MODALITY_UNSPECIFIED
MODALITY_NAMES = {IMAGE: "image", VIDEO: "video", AUDIO: "audio"}


def room_transfer_id(request_id: str, room: int) -> str:
    """The prompt KV a prefill leg holds for its decode leg (both legs carry the same
    request id and ``kv_bootstrap_info``)."""
    return f"tokenspeed:{request_id}:{room}"


def embedding_transfer_id(room: int) -> str:
    """The image embedding an encode worker holds for the prefill worker that names the
    item's ``bootstrap_room``: the room is all both sides share (the encode request's id is
    the gateway's own ``encode-…``, not the client request's)."""
    return f"tokenspeed-encode:{room}"


def content_hash(hex_hash: str) -> bytes:
    """An item's ``content_hash``: BLAKE3 of its hex media hash (the 64 ASCII characters,
    itself BLAKE3 of the fetched bytes), 32 raw bytes, as smg writes it."""
    return blake3(hex_hash.encode("ascii")).digest()


def encode_into(target: tpb.TensorData, array: np.ndarray, dtype: str | None = None) -> None:
    """``array`` inline into ``target`` in its wire layout (C order, little-endian)."""
    payload, wire = wire_payload(array, dtype)
    target.Clear()
    target.shape.extend(int(d) for d in array.shape)
    target.dtype = wire
    target.inline = payload.tobytes()


def tensor_nbytes(tensor: tpb.TensorData) -> int:
    """The payload's size as its shape and dtype state it (0 for an unknown dtype)."""
    if tensor.dtype not in WIRE_DTYPES:
        return 0
    return math.prod(int(d) for d in tensor.shape) * WIRE_DTYPES[tensor.dtype].itemsize


def decode_tensor(tensor: tpb.TensorData) -> np.ndarray:
    """A read-only view of an inline payload (bfloat16 widened to float32).

    Refuses shared-memory and remote payloads (this codebase's TokenSpeed legs are inline),
    an unknown dtype and a payload whose length disagrees with its shape.
    """
    kind = tensor.WhichOneof("payload")
    if kind != "inline":
        raise TensorCodecError(
            f"TensorData payload {kind or 'unset'!r} is not supported; send it inline"
        )
    if tensor.dtype not in WIRE_DTYPES:
        raise TensorCodecError(
            f"unsupported TensorData dtype {tensor.dtype!r}; expected one of "
            f"{', '.join(WIRE_DTYPES)}"
        )
    shape = [int(d) for d in tensor.shape]
    want = tensor_nbytes(tensor)
    if len(tensor.inline) != want:
        raise TensorCodecError(
            f"TensorData byte length mismatch for dtype={tensor.dtype}, shape={shape}: "
            f"expected {want}, got {len(tensor.inline)}"
        )
    try:
        view = np.frombuffer(tensor.inline, dtype=WIRE_DTYPES[tensor.dtype]).reshape(shape)
    except ValueError as exc:
        raise TensorCodecError(f"TensorData shape {shape} cannot be represented: {exc}") from None
    if tensor.dtype == "bfloat16":
        return bfloat16_bits_to_float32(view)
    return view


__all__ = [
    "AUDIO",
    "DEFAULT_BOOTSTRAP_PORT",
    "ENCODER_SERVICE_NAME",
    "GENERATE_METHOD",
    "GET_SERVER_INFO_METHOD",
    "IMAGE",
    "MODALITY_NAMES",
    "MODALITY_UNSPECIFIED",
    "ROOM_LIMIT",
    "SERVICE_NAME",
    "VIDEO",
    "content_hash",
    "decode_tensor",
    "embedding_transfer_id",
    "encode_into",
    "epb",
    "epb_grpc",
    "room_transfer_id",
    "tensor_nbytes",
    "tpb",
    "tpb_grpc",
]
