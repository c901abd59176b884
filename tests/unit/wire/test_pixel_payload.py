"""Pixels kept outside the message serialize to exactly the message that holds them."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from tandem.wire.pixel_splice import message_parts, serialize_with_pixels
from tandem.wire.pixels import PixelPayload
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


def test_the_parts_are_the_message_with_the_pixels_read_in_place() -> None:
    """What Tandem's HTTP/2 client writes: the serialized bytes, end to end, the inline
    pixels as a view of the array itself (the socket reads them; no copy is made)."""
    pixels = np.arange(300_000, dtype=np.float32).reshape(1000, 300)
    payload = PixelPayload.from_array(pixels)
    parts = message_parts(pixel_free_request(), payload)
    assert b"".join(parts) == serialize_with_pixels(pixel_free_request(), payload)
    last = parts[-1]
    assert isinstance(last, memoryview) and len(last) == pixels.nbytes
    assert np.shares_memory(np.frombuffer(last, dtype=np.uint8), payload.array)
    assert message_parts(pixel_free_request(), None) == (pixel_free_request().SerializeToString(),)


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


def test_a_second_batch_travels_as_extra_pixels() -> None:
    """Images in mm_inputs, a video in extra_mm_inputs[0]: both payloads stay raw for a
    worker that normalizes on device, both are normalized for any other, both land in
    their own batch."""
    rng = np.random.default_rng(7)
    image = rng.integers(0, 256, (4, 12), dtype=np.uint8)
    video = rng.integers(0, 256, (6, 12), dtype=np.uint8)
    lut = np.tile(np.linspace(-1, 1, 256, dtype=np.float32), (3, 1))
    payload = PixelPayload.raw(image, lut, "float32")
    payload.extra = PixelPayload.raw(video, lut * 2, "float32")
    req = pixel_free_request()
    req.extra_mm_inputs.add(mm_hashes=["v"])
    assert payload.total_nbytes == image.nbytes + video.nbytes and payload.has_raw
    raw = GenerateRequest.FromString(serialize_with_pixels(req, payload.for_worker(True)))
    np.testing.assert_array_equal(decode_tensor(raw.mm_inputs.pixel_values), image)
    np.testing.assert_array_equal(decode_tensor(raw.extra_mm_inputs[0].pixel_values), video)
    normalized = payload.for_worker(False)
    assert not normalized.has_raw
    parsed = GenerateRequest.FromString(serialize_with_pixels(req, normalized))
    flat = lambda a: a.reshape(a.shape[0], 3, -1)  # noqa: E731 - channel-major rows
    np.testing.assert_array_equal(
        flat(decode_tensor(parsed.extra_mm_inputs[0].pixel_values)),
        np.stack([(lut[c] * 2)[flat(video)[:, c]] for c in range(3)], axis=1),
    )
    assert not req.extra_mm_inputs[0].HasField("pixel_values"), "the request is not touched"
    assert parsed.extra_mm_inputs[0].mm_hashes == ["v"]
