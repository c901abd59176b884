"""Property-based fuzzing of the tensor codec and the PD request helpers.

The codec decodes tensors a peer sent: any bytes must decode or fail with
``TensorCodecError``, never anything else. The request helpers build the decode leg
from the prefill leg: for any request, the clones carry no pixels, keep what the decode
worker needs, and never touch the original.
"""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tandem.wire.proto import GRID_KEYS, GenerateRequest, MediaIdentity, TensorData
from tandem.wire.requests import (
    apply_media_identity,
    clone_without_mm,
    clone_without_mm_pixels,
    mm_batches,
    sampling_n,
    sanitize_sampling_for_prefill,
)
from tandem.wire.tensors import (
    DTYPE_ALIASES,
    WIRE_DTYPES,
    TensorCodecError,
    decode_tensor,
    encode_tensor,
    tensor_nbytes,
)

# Many generated cases each: left out of `make test-unit`, run by `make test`.
pytestmark = pytest.mark.fuzz

UINT32_EDGES = [0, 1, 2, 3, 2**16, 2**31 - 1, 2**32 - 1]


def fuzz(examples: int) -> settings:
    return settings(
        max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.too_slow]
    )


def decode_or_refuse(tensor: TensorData) -> np.ndarray | None:
    try:
        return decode_tensor(tensor)
    except TensorCodecError:
        return None


@fuzz(1200)
@given(st.binary(max_size=160))
def test_any_bytes_from_a_peer_decode_or_fail_cleanly(raw: bytes) -> None:
    try:
        tensor = TensorData.FromString(raw)
    except DecodeError:
        return
    out = decode_or_refuse(tensor)
    if out is not None:
        assert out.shape == tuple(tensor.shape)
        assert out.size * WIRE_DTYPES[tensor.dtype].itemsize == len(tensor.inline)
        assert tensor_nbytes(tensor) == len(tensor.inline)


@fuzz(600)
@given(
    st.lists(st.sampled_from(UINT32_EDGES) | st.integers(0, 5), max_size=4),
    st.sampled_from([*WIRE_DTYPES, *DTYPE_ALIASES, "", "float64", "int8"]) | st.text(max_size=6),
    st.binary(max_size=96),
)
def test_hostile_shape_dtype_and_payload_decode_or_fail_cleanly(
    shape: list[int], dtype: str, payload: bytes
) -> None:
    tensor = TensorData(shape=shape, dtype=dtype, inline=payload)
    out = decode_or_refuse(tensor)
    if out is not None:
        assert out.shape == tuple(shape)
        width = 2 if dtype == "bfloat16" else out.dtype.itemsize
        assert out.size * width == len(payload)
        assert not out.flags.writeable or dtype == "bfloat16"


# --- request helpers ---------------------------------------------------------------------

KEYS = [*GRID_KEYS, "aspect_ratios", "ts_sizes", "grid_sizes", "pixel_attention_mask"]
small_ints = st.lists(st.integers(0, 2**32 - 1), max_size=6)


@st.composite
def batches(draw: st.DrawFn, batch) -> None:
    """Fill ``batch`` (a MultimodalInputs field) with any mix of pixels, tensors and keys."""
    if draw(st.booleans()):
        batch.pixel_values.CopyFrom(encode_tensor(np.ones((2, 3), dtype=np.float32)))
    for key in draw(st.lists(st.sampled_from(KEYS), max_size=4, unique=True)):
        tensor = batch.model_specific_tensors[key]
        if draw(st.booleans()):
            tensor.CopyFrom(encode_tensor(np.array(draw(small_ints), dtype=np.int64)))
        else:
            tensor.shape.extend([1, 3])  # no payload
    for key, sizes in draw(st.dictionaries(st.sampled_from(KEYS), st.sampled_from(KEYS))).items():
        batch.flat_keys[key] = sizes
    batch.mm_hashes.extend(draw(st.lists(st.text(max_size=6), max_size=2)))
    for offset, length in draw(st.lists(st.tuples(st.integers(0, 99), st.integers(0, 9)))):
        batch.mm_placeholders.add(offset=offset, length=length)
    if draw(st.booleans()):
        batch.im_token_id = draw(st.integers(0, 2**32 - 1))
    batch.batched_keys.extend(draw(st.lists(st.sampled_from(["pixel_values", *KEYS]))))
    batch.keep_on_cpu_keys.extend(draw(st.lists(st.sampled_from(KEYS), max_size=2)))
    batch.modality = draw(st.integers(0, 2))


@st.composite
def requests(draw: st.DrawFn) -> GenerateRequest:
    req = GenerateRequest(request_id=draw(st.text(max_size=8)))
    if draw(st.booleans()):
        req.tokenized.input_ids.extend(draw(small_ints))
        req.tokenized.original_text = draw(st.text(max_size=8))
    else:
        req.text = draw(st.text(max_size=8))
    params = req.sampling_params
    params.n = draw(st.integers(0, 4))
    params.max_tokens = draw(st.integers(0, 2**32 - 1))
    params.min_tokens = draw(st.integers(0, 9))
    params.stop.extend(draw(st.lists(st.text(max_size=3), max_size=2)))
    params.stop_token_ids.extend(draw(st.lists(st.integers(0, 9), max_size=2)))
    if draw(st.booleans()):
        req.kv_transfer_params_json = draw(st.text(max_size=12))
    for url in draw(st.lists(st.text(max_size=10), max_size=2)):
        req.media_refs.items.add(url=url)
    count = draw(st.integers(0, 3))
    if count:
        draw(batches(req.mm_inputs))
        for _ in range(count - 1):
            draw(batches(req.extra_mm_inputs.add()))
    return req


def assert_same_request_fields(clone: GenerateRequest, original: GenerateRequest) -> None:
    assert clone.request_id == original.request_id
    assert clone.WhichOneof("input") == original.WhichOneof("input")
    assert clone.tokenized == original.tokenized and clone.text == original.text
    assert clone.sampling_params == original.sampling_params
    assert clone.kv_transfer_params_json == original.kv_transfer_params_json


@fuzz(600)
@given(requests(), st.lists(st.integers(0, 2**32 - 1), max_size=5))
def test_decode_legs_carry_no_pixels_and_leave_the_original_alone(
    request: GenerateRequest, identity_ids: list[int]
) -> None:
    before = request.SerializeToString(deterministic=True)
    hashed = [list(b.mm_hashes) for b in mm_batches(request) if b.mm_hashes]

    leg = clone_without_mm_pixels(request)
    assert_same_request_fields(leg, request)
    assert leg.media_refs == request.media_refs
    assert [list(b.mm_hashes) for b in mm_batches(leg)] == hashed
    for batch in mm_batches(leg):
        assert not batch.HasField("pixel_values")
        for key, tensor in batch.model_specific_tensors.items():
            assert tensor.WhichOneof("payload") == "inline", key
            assert key in GRID_KEYS or key in batch.flat_keys.values()
        assert set(batch.batched_keys) <= set(batch.model_specific_tensors)

    blind = clone_without_mm(request)
    assert_same_request_fields(blind, request)
    assert not blind.HasField("media_refs")
    assert [list(b.mm_hashes) for b in mm_batches(blind)] == hashed
    for batch in mm_batches(blind):
        assert not batch.model_specific_tensors and not batch.mm_placeholders
        assert not batch.HasField("pixel_values")

    identity = MediaIdentity(prompt_token_ids=identity_ids)
    unchanged = leg.SerializeToString(deterministic=True)
    if apply_media_identity(leg, identity):
        assert list(leg.tokenized.input_ids) == identity_ids
        assert not leg.HasField("media_refs") and not mm_batches(leg)
    else:
        assert leg.SerializeToString(deterministic=True) == unchanged

    assert request.SerializeToString(deterministic=True) == before


@fuzz(200)
@given(requests())
def test_a_prefill_leg_asks_for_one_token_of_one_sample(request: GenerateRequest) -> None:
    sanitize_sampling_for_prefill(request)
    once = request.SerializeToString(deterministic=True)
    params = request.sampling_params
    assert sampling_n(request) == 1 and params.max_tokens == 1 and params.min_tokens == 0
    assert not params.stop and not params.stop_token_ids and params.ignore_eos
    sanitize_sampling_for_prefill(request)
    assert request.SerializeToString(deterministic=True) == once


def test_an_empty_tensor_with_huge_dimensions_is_a_codec_error() -> None:
    for shape in ([2**32 - 1, 2**32 - 1, 0], [0, 2**32 - 1, 2**32 - 1, 2**32 - 1]):
        assert decode_or_refuse(TensorData(shape=shape, dtype="float32")) is None
