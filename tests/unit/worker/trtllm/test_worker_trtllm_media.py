"""TensorRT-LLM's ``image_data`` (source bytes) as the engine's media: decoded and
preprocessed here with the model's own processor, placed on the prompt's expanded runs.

The built-in models' weightless checkpoints carry their processor files, so the tensors
are the real ones; the router path's preprocessing of the same pictures is the reference.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tandem.engine.refusals import RefusedField
from tandem.media import MediaError, MediaPolicy, media_hash
from tandem.models import load_model_info, load_processor
from tandem.worker.media_limits import MediaRefsLimitConfig, MediaRefsLimits
from tandem.worker.trtllm.media import (
    ImageBytes,
    PlaceholderMismatch,
    image_runs,
    place_images,
    refuse_image_tokens,
    refuse_other_media_tokens,
)


def png(size: tuple[int, int], seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def images_of(model_dir: Path, **limits: int) -> ImageBytes:
    info = load_model_info(model_dir)
    config = MediaRefsLimitConfig(**limits)
    return ImageBytes(info, load_processor(model_dir), MediaPolicy(), MediaRefsLimits(config))


def expanded(model_dir: Path, blobs: list[bytes]) -> tuple[list[int], list[int]]:
    """A prompt with each picture's run at its full length, as gateways send it; and the
    runs' lengths."""
    info = load_model_info(model_dir)
    pictures = [Image.open(io.BytesIO(blob)).convert("RGB") for blob in blobs]
    counts = load_processor(model_dir).preprocess(pictures).tokens_per_image
    ids = [5]
    for n in counts:
        ids += [9, *([info.image_token_id] * n), 10]
    return [*ids, 6, 7], counts


def test_runs_are_the_maximal_spans_of_the_token() -> None:
    assert image_runs([1, 4, 4, 2, 4, 3, 4, 4, 4], 4) == [(1, 2), (4, 1), (6, 3)]
    assert image_runs([1, 2], 4) == []


def test_images_fill_the_runs_in_order_back_to_back_too() -> None:
    assert place_images([(1, 4), (8, 16)], [4, 16]) == [(1, 4), (8, 16)]
    assert place_images([(1, 8)], [4, 4]) == [(1, 4), (5, 4)], "two images back to back"


@pytest.mark.parametrize(
    ("runs", "counts", "words"),
    [
        (
            [(1, 3)],
            [4],
            "image_data[0] expands to 4 image tokens but the prompt's run of image tokens at "
            "position 1 holds 3",
        ),
        (
            [(1, 5)],
            [4],
            "image_data[0] expands to 4 image tokens but the prompt's run of image tokens at "
            "position 1 holds 5",
        ),
        ([(1, 4), (9, 4)], [4], "from position 9 on that none of the 1 image(s)"),
        ([(1, 4)], [4, 4], "has 2 image(s) but the prompt's image tokens hold only 1"),
        ([(1, 1), (5, 1)], [4, 4], "image_data[0] expands to 4 image tokens"),
    ],
)
def test_runs_that_do_not_fit_the_images_are_refused(runs, counts, words) -> None:
    with pytest.raises(PlaceholderMismatch) as info:
        place_images(runs, counts)
    assert words in str(info.value) and "expanded to its full run" in str(info.value)
    assert info.value.code == "multimodal_prompt_contract_mismatch"


@pytest.mark.parametrize("family", ["qwen", "llava"])
async def test_expanded_ids_and_bytes_become_the_routers_tensors(
    family: str, qwen_meta_dir: Path, llava_meta_dir: Path
) -> None:
    model_dir = qwen_meta_dir if family == "qwen" else llava_meta_dir
    blobs = [png((64, 48), 1), png((128, 128), 2)]
    ids, counts = expanded(model_dir, blobs)
    images = images_of(model_dir)
    media = await images.media(blobs, ids)
    info = load_model_info(model_dir)
    runs = image_runs(ids, info.image_token_id)
    assert [(i.offset, i.length) for i in media.items] == runs
    assert [i.length for i in media.items] == counts
    assert [i.mm_hash for i in media.items] == [media_hash(b) for b in blobs], "own digest"
    assert media.im_token_id == info.image_token_id
    pictures = [Image.open(io.BytesIO(b)).convert("RGB") for b in blobs]
    router = load_processor(model_dir).preprocess(pictures)
    assert media.pixel_values is not None
    assert np.array_equal(media.pixel_values, router.pixel_values), "the router path's pixels"
    assert set(media.grids) == set(router.grids)
    for key, grid in router.grids.items():
        assert np.array_equal(media.grids[key], grid)
    assert images.items_processed == 2


async def test_an_unexpanded_prompt_is_refused_naming_the_image(qwen_meta_dir: Path) -> None:
    info = load_model_info(qwen_meta_dir)
    blob = png((64, 48), 3)
    with pytest.raises(PlaceholderMismatch, match=r"image_data\[0\] expands to 4 image tokens"):
        await images_of(qwen_meta_dir).media([blob], [5, info.image_token_id, 6])


async def test_more_runs_than_images_is_refused_before_decoding(qwen_meta_dir: Path) -> None:
    info = load_model_info(qwen_meta_dir)
    token = info.image_token_id
    images = images_of(qwen_meta_dir)
    with pytest.raises(PlaceholderMismatch, match=r"has 1 image\(s\) but the prompt holds 2 run"):
        await images.media([b"not decoded"], [5, token, 6, token, 7])
    assert images.items_processed == 0


async def test_too_many_too_large_and_undecodable_images_name_the_image(
    qwen_meta_dir: Path,
) -> None:
    blob = png((64, 48), 4)
    ids, _ = expanded(qwen_meta_dir, [blob, blob])
    with pytest.raises(MediaError) as info:
        await images_of(qwen_meta_dir, max_items=1).media([blob, blob], ids)
    assert info.value.code == "multimodal_too_many_items" and "image_data has 2 images" in str(
        info.value
    )
    capped = images_of(qwen_meta_dir)
    capped.policy = MediaPolicy(max_bytes=len(blob) - 1)
    with pytest.raises(MediaError) as info:
        await capped.media([blob, blob], ids)
    assert info.value.code == "media_too_large" and "image_data[0] is" in str(info.value)
    with pytest.raises(MediaError) as info:
        await images_of(qwen_meta_dir).media([blob, b"\x89PNG not really"], ids)
    assert info.value.code == "multimodal_processing_failed"
    assert str(info.value).startswith("multimodal_input.image_data[1]: ")


def test_a_prompt_without_images_holds_no_image_or_video_tokens(qwen_meta_dir: Path) -> None:
    info = load_model_info(qwen_meta_dir)
    refuse_image_tokens([1, 2, 3], info)
    with pytest.raises(PlaceholderMismatch, match="holds 2 image token"):
        refuse_image_tokens([1, info.image_token_id, info.image_token_id], info)
    assert info.video_token_id is not None
    with pytest.raises(RefusedField) as refused:
        refuse_other_media_tokens([1, info.video_token_id], info)
    assert refused.value.code == "multimodal_not_supported"
    assert "carries images only" in str(refused.value)
