"""Tensor dtypes as the wire names them, and arrays in their wire layout (no protocol).

Every protocol that carries tensors uses these names and layouts (C order, little-endian;
bfloat16 as raw uint16); ``tensors.py`` writes them into vLLM's ``TensorData``.
"""

from __future__ import annotations

import numpy as np

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
