"""SGLang's ``mm_inputs`` as the engine's media: items, identities, refusals.

The tensors come from the built-in models' own processor (weightless checkpoints), laid
out as a gateway's router path sends them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tandem.models import expand_placeholders, load_model_info, load_processor
from tandem.models.info import ModelInfo
from tandem.wire.sglang import encode_into, spb
from tandem.worker.sglang.media import item_hashes, refuse_unread_media, wire_media

RED, BLUE = Image.new("RGB", (64, 64), (255, 0, 0)), Image.new("RGB", (64, 64), (0, 0, 255))


def build(model_dir: Path, images: list[Image.Image]) -> tuple[spb.GenerateRequest, ModelInfo]:
    info = load_model_info(model_dir)
    pre = load_processor(model_dir).preprocess(images)
    ids = [5, *([info.anchor_token_id] * len(images)), 6, 7]
    ids, ranges = expand_placeholders(
        ids, info.anchor_token_id, pre.tokens_per_image, info.image_token_id
    )
    req = spb.GenerateRequest(request_id="m")
    req.tokenized.input_ids.extend(ids)
    batch = req.mm_inputs
    batch.modalities.append("image")
    encode_into(batch.pixel_values, pre.pixel_values)
    for key, value in pre.grids.items():
        encode_into(batch.model_specific_tensors[key], np.asarray(value))
    if pre.patches_per_image is not None:
        encode_into(batch.model_specific_tensors["patches_per_image"], pre.patches_per_image)
    batch.im_token_id = info.image_token_id
    for offset, length in ranges:
        batch.mm_placeholders.add(offset=offset, length=length)
    return req, info


def media(req: spb.GenerateRequest, info: ModelInfo, vision: bool = True):
    return wire_media(req, list(req.tokenized.input_ids), info, supports_vision=vision)


@pytest.mark.parametrize("family", ["qwen", "llava"])
def test_one_item_per_placeholder_with_its_own_identity(family, qwen_meta_dir, llava_meta_dir):
    model_dir = qwen_meta_dir if family == "qwen" else llava_meta_dir
    req, info = build(model_dir, [RED, BLUE, RED])
    got = media(req, info)
    assert got is not None and got.pixel_values is not None
    ranges = [(p.offset, p.length) for p in req.mm_inputs.mm_placeholders]
    assert [(i.offset, i.length, i.modality) for i in got.items] == [(*r, "image") for r in ranges]
    red, blue, red_again = got.hashes
    assert red == red_again != blue, "an image's identity is its own pixels"
    if family == "qwen":
        assert got.grids["image_grid_thw"].shape == (3, 3)
    alone, _ = build(model_dir, [BLUE])
    assert media(alone, info).hashes == [blue], "the same image, the same identity"


def test_hashes_fall_back_to_the_batch_when_rows_are_not_per_image() -> None:
    pixels = np.arange(12, dtype=np.float32).reshape(3, 4)
    hashes = item_hashes(pixels, {}, 2)  # three rows, two images, no layout said
    assert hashes[0].endswith("-0") and hashes[1].endswith("-1")
    assert hashes[0][:-2] == hashes[1][:-2]


def test_without_pixels_mm_inputs_is_ignored_but_image_tokens_are_refused(qwen_meta_dir):
    req, info = build(qwen_meta_dir, [RED])
    req.mm_inputs.ClearField("pixel_values")
    with pytest.raises(ValueError, match=r"no mm_inputs\.pixel_values"):
        media(req, info)
    text = spb.GenerateRequest()
    text.tokenized.input_ids.extend([5, 6, 7])
    text.mm_inputs.modalities.append("image")  # pixel-less: ignored
    assert media(text, info) is None


def test_a_language_model_only_worker_refuses_pixels(llava_meta_dir) -> None:
    req, info = build(llava_meta_dir, [RED])
    with pytest.raises(ValueError, match="--language-model-only"):
        media(req, info, vision=False)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda b: b.modalities.append("video"), "modality 'video'"),
        (lambda b: setattr(b, "im_token_id", 3), "im_token_id 3"),
        (lambda b: b.ClearField("mm_placeholders"), "no mm_placeholders"),
        (lambda b: b.mm_placeholders.add(offset=0, length=10_000), "outside"),
        (lambda b: b.mm_placeholders.add(offset=2, length=1), "overlaps"),
        (lambda b: setattr(b.pixel_values, "dtype", "float64"), "unsupported TensorData dtype"),
        (lambda b: setattr(b.pixel_values, "data", b"\x00" * 3), "byte length mismatch"),
    ],
)
def test_malformed_batches_are_refused(qwen_meta_dir, change, words: str) -> None:
    req, info = build(qwen_meta_dir, [RED])
    change(req.mm_inputs)
    with pytest.raises(ValueError, match=words):
        media(req, info)


@pytest.mark.parametrize("field", ["image_urls", "video_urls", "audio_urls", "video_data"])
def test_media_the_worker_would_fetch_or_decode_are_refused(field: str) -> None:
    req = spb.GenerateRequest()
    value = b"x" if field.endswith("_data") else "https://example.com/x"
    getattr(req.mm_inputs, field).append(value)
    with pytest.raises(ValueError, match=f"mm_inputs.{field}"):
        refuse_unread_media(req)


def test_raw_image_bytes_are_ignored_beside_pixels_and_refused_without(qwen_meta_dir) -> None:
    req, _ = build(qwen_meta_dir, [RED])
    req.mm_inputs.image_data.append(b"\x89PNG...")  # smg sends them as well
    refuse_unread_media(req)
    req.mm_inputs.ClearField("pixel_values")
    with pytest.raises(ValueError, match=r"mm_inputs\.image_data"):
        refuse_unread_media(req)
