"""Tensor codec: exact byte layout, dtype handling, length checks, zero-copy decode."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tandem.wire.proto import TensorData
from tandem.wire.tensors import (
    TensorCodecError,
    bfloat16_bits_to_float32,
    canonical_dtype,
    decode_tensor,
    encode_tensor,
    float32_to_bfloat16_bits,
    tensor_nbytes,
)


def test_int64_grid_layout_is_little_endian_row_major() -> None:
    td = encode_tensor(np.array([1, 4, 6], dtype=np.int64))
    assert td.dtype == "int64"
    assert list(td.shape) == [3]
    assert td.inline == struct.pack("<3q", 1, 4, 6)


def test_two_image_grid_is_48_bytes() -> None:
    td = encode_tensor(np.array([[1, 4, 6], [1, 2, 2]], dtype=np.int64))
    assert list(td.shape) == [2, 3] and len(td.inline) == 48


def test_int32_widens_to_int64_and_float64_narrows_to_float32() -> None:
    ints = encode_tensor(np.array([[1, 2], [3, 4]], dtype=np.int32))
    floats = encode_tensor(np.array([0.5, 1.25], dtype=np.float64))
    assert ints.dtype == "int64" and floats.dtype == "float32"
    assert decode_tensor(ints).tolist() == [[1, 2], [3, 4]]
    assert decode_tensor(floats).tolist() == [0.5, 1.25]


@pytest.mark.parametrize(
    ("dtype", "array"),
    [
        ("float32", np.arange(12, dtype=np.float32).reshape(3, 4) / 7),
        ("float16", np.arange(6, dtype=np.float16).reshape(2, 3)),
        ("uint8", np.arange(10, dtype=np.uint8)),
        ("int64", np.array([-(2**40), 0, 2**40], dtype=np.int64)),
        ("uint32", np.array([0, 2**31 + 5], dtype=np.uint32)),
    ],
)
def test_round_trip_is_exact(dtype: str, array: np.ndarray) -> None:
    out = decode_tensor(encode_tensor(array, dtype))
    assert out.dtype == np.dtype(dtype).newbyteorder("<") or out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out, array)


def test_bfloat16_rounds_to_nearest_even() -> None:
    # 1 + 2^-8 lies exactly between two bf16 values (1.0 and 1 + 2^-7): ties go to even (1.0).
    # 1 + 3*2^-8 lies between 1+2^-7 (odd) and 1+2^-6 (even): ties go to 1 + 2^-6.
    values = np.array([1.0 + 2**-8, 1.0 + 3 * 2**-8, 1.0 + 2**-8 + 2**-20], dtype=np.float32)
    bits = float32_to_bfloat16_bits(values)
    back = bfloat16_bits_to_float32(bits)
    assert back.tolist() == [1.0, 1.0 + 2**-6, 1.0 + 2**-7]


def test_bfloat16_keeps_nan_and_inf() -> None:
    values = np.array([np.nan, np.inf, -np.inf, 0.0], dtype=np.float32)
    back = decode_tensor(encode_tensor(values, "bf16"))
    assert np.isnan(back[0]) and back[1] == np.inf and back[2] == -np.inf and back[3] == 0.0


def test_length_mismatch_names_expected_and_actual() -> None:
    td = TensorData(shape=[2, 3], dtype="int64", inline=b"\0" * 40)
    with pytest.raises(TensorCodecError, match="expected 48, got 40"):
        decode_tensor(td)


def test_unknown_dtype_is_refused() -> None:
    with pytest.raises(TensorCodecError, match="Unsupported proto tensor dtype"):
        decode_tensor(TensorData(shape=[1], dtype="complex64", inline=b"\0" * 8))
    with pytest.raises(TensorCodecError):
        canonical_dtype("int8")


def test_aliases_write_canonical_names() -> None:
    assert canonical_dtype("BF16") == "bfloat16"
    assert canonical_dtype("half") == "float16"
    assert encode_tensor(np.zeros(2, np.float32), "fp32").dtype == "float32"


def test_float_to_integer_wire_dtype_is_refused() -> None:
    with pytest.raises(TensorCodecError, match="truncate"):
        encode_tensor(np.array([0.5], dtype=np.float32), "int64")


def test_remote_payload_is_refused_clearly() -> None:
    td = TensorData(shape=[4], dtype="uint8")
    td.remote.transport = "nixl"
    td.remote.nbytes = 4
    with pytest.raises(TensorCodecError, match="remote payload is not supported"):
        decode_tensor(td)


def test_shm_payload_naming_no_segment_is_refused_clearly() -> None:
    # Shared-memory payloads are read (tests/unit/wire/test_shm.py); a missing one is refused.
    td = TensorData(shape=[4], dtype="uint8")
    td.shm.name = "tandem-0-0-424242"
    td.shm.nbytes = 4
    with pytest.raises(TensorCodecError, match="cannot be opened on this worker"):
        decode_tensor(td)


def test_decode_is_a_read_only_view() -> None:
    out = decode_tensor(encode_tensor(np.arange(4, dtype=np.float32)))
    assert not out.flags.writeable
    assert out.base is not None  # a view over the payload bytes, not a fresh copy


def test_encode_makes_at_most_one_copy_for_wire_layout_arrays() -> None:
    array = np.arange(1 << 18, dtype=np.float32)
    # ascontiguousarray must hand back the very same array: the only copy is tobytes().
    assert np.ascontiguousarray(array, dtype="<f4") is array
    assert tensor_nbytes(encode_tensor(array)) == array.nbytes


@settings(max_examples=300, deadline=None)
@given(
    hnp.arrays(
        dtype=st.sampled_from([np.float32, np.float16, np.uint8, np.int64, np.uint32]),
        shape=hnp.array_shapes(min_dims=0, max_dims=4, max_side=5),
    )
)
def test_round_trip_property(array: np.ndarray) -> None:
    out = decode_tensor(encode_tensor(array))
    assert out.shape == array.shape
    np.testing.assert_array_equal(out, array)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64), st.lists(st.integers(0, 6), max_size=3))
def test_arbitrary_payloads_decode_or_fail_cleanly(payload: bytes, shape: list[int]) -> None:
    td = TensorData(shape=shape, dtype="float32", inline=payload)
    try:
        out = decode_tensor(td)
    except TensorCodecError:
        return
    assert out.nbytes == len(payload)
