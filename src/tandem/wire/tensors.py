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

from tandem.wire.proto import TensorData
from tandem.wire.shm import ShmError, read_segment

# Canonical wire names → little-endian numpy dtypes. bfloat16 travels as raw uint16.
WIRE_DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype("<f4"),
    "bfloat16": np.dtype("<u2"),
    "float16": np.dtype("<f2"),
    "uint8": np.dtype("u1"),
    "int64": np.dtype("<i8"),
    "uint32": np.dtype("<u4"),
}

DTYPE_ALIASES: dict[str, str] = {
    "fp32": "float32",
    "f32": "float32",
    "bf16": "bfloat16",
    "fp16": "float16",
    "f16": "float16",
    "half": "float16",
}


class TensorCodecError(ValueError):
    """A tensor that cannot be encoded or a payload that does not decode."""


def canonical_dtype(name: str) -> str:
    """Canonical wire name for a configured dtype name or alias."""
    lowered = name.strip().lower()
    lowered = DTYPE_ALIASES.get(lowered, lowered)
    if lowered not in WIRE_DTYPES:
        raise TensorCodecError(f"Unsupported proto tensor dtype {name!r}")
    return lowered


def default_wire_dtype(array: np.ndarray) -> str:
    """Wire dtype for an array when the caller does not choose one.

    Other integer widths widen to int64 and other floats narrow to float32,
    as the identity builder and vLLM's servicer expect.
    """
    kind = array.dtype.kind
    if kind == "f":
        return "float16" if array.dtype == np.float16 else "float32"
    if kind == "u":
        return {1: "uint8", 4: "uint32"}.get(array.dtype.itemsize, "int64")
    if kind in "ib":
        return "int64"
    raise TensorCodecError(f"cannot put a {array.dtype} tensor on the wire")


def float32_to_bfloat16_bits(array: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns of float32 values, rounding to nearest even."""
    bits = np.ascontiguousarray(array, dtype="<f4").view("<u4")
    rounding = ((bits >> 16) & 1) + np.uint32(0x7FFF)
    out: np.ndarray = ((bits + rounding) >> 16).astype("<u2")
    # Rounding must not turn a NaN into infinity: keep NaNs quiet NaNs.
    nan = np.isnan(array)
    if nan.any():
        out[nan.reshape(out.shape)] = np.uint16(0x7FC0)
    return out


def bfloat16_bits_to_float32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype("<u4") << 16).view("<f4")


def wire_payload(array: np.ndarray, dtype: str | None = None) -> tuple[np.ndarray, str]:
    """``array`` in its wire layout (C order, little-endian, wire dtype) and that dtype's name.

    No copy when the array already has the layout; bfloat16 is rounded to nearest even.
    """
    wire = canonical_dtype(dtype) if dtype else default_wire_dtype(array)
    if wire == "bfloat16":
        if array.dtype.kind != "f":
            raise TensorCodecError(f"bfloat16 needs a floating tensor, got {array.dtype}")
        return float32_to_bfloat16_bits(array), wire
    target = WIRE_DTYPES[wire]
    if array.dtype.kind == "f" and target.kind in "iu":
        raise TensorCodecError(f"refusing to truncate a {array.dtype} tensor to {wire}")
    return np.ascontiguousarray(array, dtype=target), wire


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
