"""Router path with the built-in models: real fetches from a loopback origin and data URLs,
the real processors, and the assembled vLLM-layout ``MultimodalInputs``."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from blake3 import blake3
from mm_gateway_models import Model
from mm_gateway_origin import ImageOrigin, data_url, png_bytes
from PIL import Image

from tandem.errors import TandemError
from tandem.gateway.backends.vllm.mm_inputs import expand_and_assemble
from tandem.gateway.multimodal import ProcessedImages, plan_images, process_images
from tandem.media import MediaPolicy
from tandem.wire.pixels import normalize_raw
from tandem.wire.proto import GenerateRequest, Modality, MultimodalInputs
from tandem.wire.tensors import decode_tensor

# Two sizes, so that Qwen's dynamic resolution gives the images different grids.
SMALL, LARGE = png_bytes((40, 30), seed=1), png_bytes((96, 64), seed=2)

# What vLLM expects for each family (docs/pd-contract.md §4), written out rather than read from the
# family specs so that a wrong spec fails here.
LAYOUT = {
    "tiny-qwen3-vl": {
        "tensors": {"image_grid_thw": ("int64", 2), "patches_per_image": ("int64", 1)},
        "batched": {"image_grid_thw", "patches_per_image"},
        "flat": {"pixel_values": "patches_per_image"},
        "keep_on_cpu": ["image_grid_thw"],
        "pixel_ndim": 2,
    },
    "tiny-llava-1.5": {
        "tensors": {},
        "batched": {"pixel_values"},
        "flat": {},
        "keep_on_cpu": [],
        "pixel_ndim": 4,
    },
}


async def _process(model: Model, urls: list[str], policy: MediaPolicy) -> ProcessedImages:
    return await process_images(plan_images(urls), model.info, model.processor, policy)


async def _expect_error(model: Model, urls: list[str], policy: MediaPolicy) -> TandemError:
    with pytest.raises(TandemError) as info:
        await _process(model, urls, policy)
    assert info.value.status == 400
    return info.value


async def test_http_and_data_images_are_processed_and_hashed(
    model: Model, origin: ImageOrigin, open_policy: MediaPolicy
) -> None:
    urls = [origin.serve("/small.png", SMALL), data_url(LARGE)]
    processed = await _process(model, urls, open_policy)
    assert origin.state.paths() == ["/small.png"]
    assert len(processed) == 2
    # BLAKE3 of the encoded bytes as fetched: the HTTP body, the base64-decoded payload.
    assert processed.hashes == [blake3(SMALL).hexdigest(), blake3(LARGE).hexdigest()]
    assert processed.encoded_bytes == [len(SMALL), len(LARGE)]
    t = processed.timings
    assert t.fetch_s > 0 and t.decode_s > 0 and t.preprocess_s > 0
    # Same tensors as the processor gives for the same images directly.
    # Raw uint8 until a leg is sent (see test_assembled_batch_has_the_vllm_layout).
    images = [Image.open(io.BytesIO(b)) for b in (SMALL, LARGE)]
    direct = model.processor.preprocess(images, raw=True)
    assert processed.pixel_values is not None and processed.pixel_values.dtype == np.uint8
    assert np.array_equal(processed.pixel_values, direct.pixel_values)
    assert np.array_equal(processed.normalize_lut, direct.normalize_lut)
    assert processed.tokens_per_image == direct.tokens_per_image


async def test_assembled_batch_has_the_vllm_layout(
    model: Model, origin: ImageOrigin, open_policy: MediaPolicy
) -> None:
    urls = [origin.serve("/a.png", SMALL), origin.serve("/b.png", LARGE)]
    ids = model.prompt_ids(urls)
    processed = await _process(model, urls, open_policy)
    raw, lut = processed.pixel_values, processed.normalize_lut
    assert raw is not None and lut is not None
    pixels = normalize_raw(raw, lut)  # what a worker that does not normalize itself gets
    normalized = model.processor.preprocess([Image.open(io.BytesIO(b)) for b in (SMALL, LARGE)])
    assert np.array_equal(pixels, normalized.pixel_values)
    tokens, hashes = list(processed.tokens_per_image), list(processed.hashes)
    expanded, batch = expand_and_assemble(ids, processed, model.info)

    want = LAYOUT[model.name]
    info = model.info
    assert batch.modality == Modality.IMAGE
    assert batch.im_token_id == info.image_token_id
    assert list(batch.mm_hashes) == hashes
    assert set(batch.batched_keys) == want["batched"]
    assert dict(batch.flat_keys) == want["flat"]
    assert list(batch.keep_on_cpu_keys) == want["keep_on_cpu"]
    assert not batch.HasField("encoder_input_key")
    got = {k: (t.dtype, len(t.shape)) for k, t in batch.model_specific_tensors.items()}
    assert got == want["tensors"]

    wire_pixels = decode_tensor(batch.pixel_values)
    assert batch.pixel_values.dtype == "float32"
    assert wire_pixels.ndim == want["pixel_ndim"]
    assert np.array_equal(wire_pixels, pixels)
    assert processed.pixel_values is None  # handed over to the message, not kept twice

    ranges = [(p.offset, p.length) for p in batch.mm_placeholders]
    assert [length for _, length in ranges] == tokens
    for offset, length in ranges:
        assert expanded[offset : offset + length] == [info.image_token_id] * length
    assert expanded.count(info.image_token_id) == sum(tokens)
    # Collapsing each run back to one anchor gives the prompt that was sent.
    collapsed = list(expanded)
    for offset, length in reversed(ranges):
        collapsed[offset : offset + length] = [info.anchor_token_id]
    assert collapsed == ids

    if model.name == "tiny-qwen3-vl":
        grid = decode_tensor(batch.model_specific_tensors["image_grid_thw"])
        sizes = decode_tensor(batch.model_specific_tensors["patches_per_image"])
        assert grid.shape == (2, 3) and sizes.shape == (2,)
        assert sizes.tolist() == grid.prod(axis=1).tolist()
        assert int(sizes.sum()) == wire_pixels.shape[0]
        merge = info.spatial_merge_size or 0
        assert tokens == [int(s) // (merge * merge) for s in sizes]
        assert tokens[0] != tokens[1]  # the two sizes really differ
        vision_start = model.tokenizer.token_to_id("<|vision_start|>")
        assert all(expanded[offset - 1] == vision_start for offset, _ in ranges)
    else:
        assert wire_pixels.shape[:2] == (2, 3)
        assert tokens == [info.image_seq_length] * 2


@pytest.mark.parametrize(
    ("dtype", "wire", "tolerance"), [("bf16", "bfloat16", 1e-2), ("float16", "float16", 1e-3)]
)
async def test_pixel_wire_dtype_can_be_narrowed(
    qwen: Model, open_policy: MediaPolicy, dtype: str, wire: str, tolerance: float
) -> None:
    urls = [data_url(SMALL)]
    processed = await _process(qwen, urls, open_policy)
    assert processed.pixel_values is not None and processed.normalize_lut is not None
    pixels = normalize_raw(processed.pixel_values, processed.normalize_lut)
    _, batch = expand_and_assemble(qwen.prompt_ids(urls), processed, qwen.info, pixel_dtype=dtype)
    tensor = batch.pixel_values
    assert tensor.dtype == wire and list(tensor.shape) == list(pixels.shape)
    assert len(tensor.inline) == pixels.size * 2
    np.testing.assert_allclose(decode_tensor(tensor), pixels, rtol=tolerance, atol=tolerance)
    # Grids are never narrowed.
    assert batch.model_specific_tensors["image_grid_thw"].dtype == "int64"


async def test_assembly_can_write_straight_into_the_request(
    llava: Model, open_policy: MediaPolicy
) -> None:
    urls = [data_url(SMALL)]
    processed = await _process(llava, urls, open_policy)
    request = GenerateRequest(request_id="r1")
    request.mm_inputs.mm_hashes.append("stale")  # overwritten, not appended to
    expanded, batch = expand_and_assemble(
        llava.prompt_ids(urls), processed, llava.info, out=request.mm_inputs
    )
    request.tokenized.input_ids.extend(expanded)
    assert request.HasField("mm_inputs")
    assert list(request.mm_inputs.mm_hashes) == [blake3(SMALL).hexdigest()]
    assert request.mm_inputs.pixel_values.inline == batch.pixel_values.inline
    assert isinstance(batch, MultimodalInputs)


async def test_refused_pixel_dtype(llava: Model, open_policy: MediaPolicy) -> None:
    urls = [data_url(SMALL)]
    processed = await _process(llava, urls, open_policy)
    with pytest.raises(ValueError, match="pixel wire dtype"):
        expand_and_assemble(llava.prompt_ids(urls), processed, llava.info, pixel_dtype="int64")
    assert processed.pixel_values is not None  # nothing consumed by a refused call


@pytest.mark.parametrize(("anchors", "images"), [(2, 1), (1, 2), (0, 1)])
async def test_anchor_mismatch_is_400_contract_mismatch(
    model: Model, open_policy: MediaPolicy, anchors: int, images: int
) -> None:
    ids = model.prompt_ids(["x"] * anchors)
    processed = await _process(
        model, [data_url(png_bytes((32, 32), seed=s)) for s in range(images)], open_policy
    )
    with pytest.raises(TandemError) as info:
        expand_and_assemble(ids, processed, model.info)
    err = info.value
    assert (err.code, err.status) == ("multimodal_prompt_contract_mismatch", 400)
    assert f"has {anchors} image placeholder" in err.message
    assert f"{images} image(s)" in err.message


async def test_loopback_origin_is_refused_without_the_allow_flag(
    qwen: Model, origin: ImageOrigin, strict_policy: MediaPolicy
) -> None:
    for host in ("127.0.0.1", "localhost"):
        origin.serve("/a.png", SMALL)
        err = await _expect_error(qwen, [origin.url("/a.png", host=host)], strict_policy)
        assert err.code == "media_url_refused", host
    assert origin.state.paths() == []  # refused before anything connected


async def test_fetch_and_decode_failures_are_400_processing_failed(
    qwen: Model, origin: ImageOrigin, open_policy: MediaPolicy
) -> None:
    good = origin.serve("/good.png", SMALL)
    missing = origin.url("/missing.png")
    assert (await _expect_error(qwen, [good, missing], open_policy)).code == (
        "multimodal_processing_failed"
    )
    corrupt = origin.serve("/corrupt.png", SMALL[: len(SMALL) // 2])
    err = await _expect_error(qwen, [corrupt], open_policy)
    assert err.code == "multimodal_processing_failed"
    err = await _expect_error(qwen, ["data:image/png;base64,not base64!"], open_policy)
    assert err.code == "multimodal_processing_failed"


async def test_policy_refusals_keep_their_codes(
    qwen: Model, origin: ImageOrigin, tmp_path: Path
) -> None:
    small_cap = MediaPolicy(allow_private_hosts=True, max_bytes=len(SMALL) - 1)
    err = await _expect_error(qwen, [origin.serve("/a.png", SMALL)], small_cap)
    assert err.code == "media_too_large"
    assert (await _expect_error(qwen, [data_url(SMALL)], small_cap)).code == "media_too_large"
    open_policy = MediaPolicy(allow_private_hosts=True)
    for url in ("ftp://media.test/a.png", (tmp_path / "a.png").as_uri()):
        assert (await _expect_error(qwen, [url], open_policy)).code == "media_url_refused", url
    only_media_test = MediaPolicy(allow_private_hosts=True, allowed_domains=("media.test",))
    err = await _expect_error(qwen, [origin.serve("/b.png", SMALL)], only_media_test)
    assert err.code == "media_url_refused"


async def test_file_urls_inside_the_allowed_directory(qwen: Model, tmp_path: Path) -> None:
    (tmp_path / "a.png").write_bytes(LARGE)
    policy = MediaPolicy(allowed_local_path=tmp_path)
    processed = await _process(qwen, [(tmp_path / "a.png").as_uri()], policy)
    assert processed.hashes == [blake3(LARGE).hexdigest()]


async def test_processor_of_another_family_is_refused(
    qwen: Model, llava: Model, open_policy: MediaPolicy
) -> None:
    with pytest.raises(ValueError, match="family"):
        await process_images(
            plan_images([data_url(SMALL)]), qwen.info, llava.processor, open_policy
        )


@pytest.mark.parametrize("dtype", ["float32", "bf16"])
async def test_workers_that_normalize_on_device_get_raw_uint8(
    qwen: Model, open_policy: MediaPolicy, dtype: str
) -> None:
    """vLLM's ``mm_device_do_normalize``: the model rescales and normalizes, so normalized
    values would be normalized twice; the worker gets the resized uint8 pixels instead."""
    urls = [data_url(SMALL)]
    processed = await _process(qwen, urls, open_policy)
    raw = processed.pixel_values
    assert raw is not None
    ids = qwen.prompt_ids(urls)
    _, batch = expand_and_assemble(
        ids, processed, qwen.info, pixel_dtype=dtype, device_normalizes=True
    )
    assert batch.pixel_values.dtype == "uint8"
    assert np.array_equal(decode_tensor(batch.pixel_values), raw)
    assert batch.model_specific_tensors["image_grid_thw"].dtype == "int64"
