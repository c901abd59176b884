"""Tensor codec between numpy arrays and ``TensorData`` (docs/pd-contract.md §17).

Decoding reads inline payloads and same-host shared-memory ones (``tandem.wire.shm``).
The inline payload is the elements in C order, each little-endian, no header.
Encoding makes at most one copy (``tobytes``) beyond a dtype conversion that
the wire format itself demands; decoding returns a zero-copy read-only view of
the message bytes wherever the dtype allows (everything but bfloat16, which
numpy cannot represent and is widened to float32).
"""

from __future__ import annotations

import math

import numpy as np

from tandem.wire.dtypes import (  # re-exported: the codec's callers name them here
    DTYPE_ALIASES,
    WIRE_DTYPES,
    TensorCodecError,
    bfloat16_bits_to_float32,
    canonical_dtype,
    default_wire_dtype,
    float32_to_bfloat16_bits,
    wire_payload,
)
from tandem.wire.proto import TensorData
from tandem.wire.shm import ShmError, read_segment


def encode_into(target: TensorData, array: np.ndarray, dtype: str | None = None) -> None:
    """Encode ``array`` inline straight into ``target`` (a field of a larger message).

    Writing in place avoids the second payload copy that ``CopyFrom`` of a fresh
    message would cost.
    """
    payload, wire = wire_payload(array, dtype)
    target.Clear()
    target.shape.extend(int(d) for d in array.shape)
    target.dtype = wire
    target.inline = payload.tobytes()


def encode_tensor(array: np.ndarray, dtype: str | None = None) -> TensorData:
    """Encode ``array`` inline as ``dtype`` (canonical name or alias)."""
    tensor = TensorData()
    encode_into(tensor, array, dtype)
    return tensor


def expected_nbytes(shape: list[int], dtype: str) -> int:
    return math.prod(shape) * WIRE_DTYPES[dtype].itemsize


def decode_tensor(tensor: TensorData) -> np.ndarray:
    """Decode an inline ``TensorData``; bfloat16 comes back widened to float32.

    The result is read-only when it is a view of the message bytes.
    """
    payload_kind = tensor.WhichOneof("payload")
    if tensor.dtype not in WIRE_DTYPES:
        raise TensorCodecError(f"Unsupported proto tensor dtype {tensor.dtype!r}")
    shape = [int(d) for d in tensor.shape]
    want = expected_nbytes(shape, tensor.dtype)
    payload: bytes
    if payload_kind == "inline":
        payload = tensor.inline
    elif payload_kind == "shm":
        payload = _read_shm(tensor, shape, want)
    elif payload_kind is None and want == 0:
        payload = b""
    else:
        raise TensorCodecError(
            f"TensorData.{payload_kind} payload is not supported here; "
            "send tensors inline or in shared memory"
        )
    if len(payload) != want:
        raise TensorCodecError(
            f"TensorData byte length mismatch for dtype={tensor.dtype}, shape={shape}: "
            f"expected {want}, got {len(payload)}"
        )
    try:
        view = np.frombuffer(payload, dtype=WIRE_DTYPES[tensor.dtype]).reshape(shape)
    except ValueError as exc:
        # An empty tensor whose other dimensions are huge: numpy cannot index that shape.
        raise TensorCodecError(f"TensorData shape {shape} cannot be represented: {exc}") from None
    if tensor.dtype == "bfloat16":
        try:
            return bfloat16_bits_to_float32(view)
        except ValueError as exc:  # empty, but widening to 4 bytes overflows numpy's size
            raise TensorCodecError(
                f"TensorData shape {shape} cannot be represented: {exc}"
            ) from None
    return view


def _read_shm(tensor: TensorData, shape: list[int], want: int) -> bytes:
    """The payload of a ``TensorData.shm`` handle (the segment is unlinked once read).

    The handle's size is checked against the shape before anything is opened, so a
    handle that disagrees with its tensor never costs a read.
    """
    if int(tensor.shm.nbytes) != want:
        raise TensorCodecError(
            f"TensorData.shm byte length mismatch for dtype={tensor.dtype}, shape={shape}: "
            f"expected {want}, got {int(tensor.shm.nbytes)}"
        )
    try:
        return read_segment(tensor.shm)
    except ShmError as exc:
        raise TensorCodecError(str(exc)) from None


def tensor_nbytes(tensor: TensorData) -> int:
    """Payload bytes of an inline or shared-memory tensor without reading the payload."""
    if tensor.WhichOneof("payload") not in ("inline", "shm") or tensor.dtype not in WIRE_DTYPES:
        return 0
    return expected_nbytes([int(d) for d in tensor.shape], tensor.dtype)


__all__ = [
    "DTYPE_ALIASES",
    "WIRE_DTYPES",
    "TensorCodecError",
    "bfloat16_bits_to_float32",
    "canonical_dtype",
    "decode_tensor",
    "default_wire_dtype",
    "encode_into",
    "encode_tensor",
    "expected_nbytes",
    "float32_to_bfloat16_bits",
    "tensor_nbytes",
    "wire_payload",
]
