"""Pixels kept outside the message serialize to exactly the message that holds them."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from tandem.wire.pixels import PixelPayload, serialize_with_pixels
from tandem.wire.proto import GenerateRequest
from tandem.wire.requests import clone_without_mm_pixels
from tandem.wire.tensors import decode_tensor, encode_tensor

MIB = 1 << 20


def pixel_free_request() -> GenerateRequest:
    req = GenerateRequest(request_id="px")
    req.tokenized.input_ids.extend([1, 2, 3, 3, 4])
    req.mm_inputs.mm_hashes.append("h")
    req.mm_inputs.mm_placeholders.add(offset=2, length=2)
    req.mm_inputs.model_specific_tensors["image_grid_thw"].CopyFrom(
        encode_tensor(np.array([[1, 2, 4]], dtype=np.int64))
    )
    req.mm_inputs.batched_keys.append("image_grid_thw")
    return req


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_serialized_bytes_parse_as_the_full_request(dtype: str) -> None:
    pixels = np.random.default_rng(1).random((8, 12), dtype=np.float32)
    req = pixel_free_request()
    parsed = GenerateRequest.FromString(
        serialize_with_pixels(req, PixelPayload.from_array(pixels, dtype))
    )
    expected = pixel_free_request()
    expected.mm_inputs.pixel_values.CopyFrom(encode_tensor(pixels, dtype))
    assert parsed == expected
    np.testing.assert_array_equal(
        decode_tensor(parsed.mm_inputs.pixel_values), decode_tensor(encode_tensor(pixels, dtype))
    )


def test_large_payloads_use_multi_byte_lengths() -> None:
    pixels = np.arange(300_000, dtype=np.float32)
    parsed = GenerateRequest.FromString(
        serialize_with_pixels(pixel_free_request(), PixelPayload.from_array(pixels))
    )
    assert decode_tensor(parsed.mm_inputs.pixel_values).tolist()[-3:] == [299997, 299998, 299999]


def test_request_without_pixels_is_unchanged() -> None:
    req = pixel_free_request()
    assert serialize_with_pixels(req, None) == req.SerializeToString()


def test_two_payloads_are_refused() -> None:
    req = pixel_free_request()
    req.mm_inputs.pixel_values.CopyFrom(encode_tensor(np.zeros(2, np.float32)))
    with pytest.raises(ValueError, match="already holds"):
        serialize_with_pixels(req, PixelPayload.from_array(np.zeros(2, np.float32)))


def _rss_and_peak() -> tuple[int, int]:
    values = {}
    with open("/proc/self/status") as status:
        for line in status:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0]) * 1024
    return values["VmRSS"], values["VmHWM"]


def test_one_image_request_peaks_below_two_pixel_tensors_beside_the_pixels() -> None:
    """Behaviour A, measured with the kernel's peak-RSS counter (reset through clear_refs):
    from the moment the preprocessed pixel tensor exists, building the pixel-free decode leg
    and serializing the prefill leg adds at most one more pixel-tensor-sized buffer, so the
    request's pixel memory peaks at 2x the tensor, never 3x as with pixels inside the proto.
    """
    size = 48 * MIB
    pixels = np.random.default_rng(2).random(size // 4, dtype=np.float32)
    gc.collect()
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # reset VmHWM to the current RSS
    rss_before, _ = _rss_and_peak()
    request = pixel_free_request()
    payload = PixelPayload.from_array(pixels)
    decode_leg = clone_without_mm_pixels(request)
    wire = serialize_with_pixels(request, payload)
    _, peak = _rss_and_peak()
    extra = (peak - rss_before) / size
    assert len(wire) > size and decode_leg.ByteSize() < 1024
    assert extra < 1.1, f"peak grew by {extra:.2f} pixel tensors"

    # Control: putting the same tensor into the message first costs two extra copies.
    del wire
    gc.collect()
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")
    rss_before, _ = _rss_and_peak()
    full = pixel_free_request()
    full.mm_inputs.pixel_values.CopyFrom(encode_tensor(pixels))
    full.SerializeToString()
    _, peak = _rss_and_peak()
    assert (peak - rss_before) / size > 1.9
