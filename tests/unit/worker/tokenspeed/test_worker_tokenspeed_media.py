"""TokenSpeed's ``mm_inputs.items`` as the engine's media: items, identities, refusals.

The tensors come from the built-in models' own processor (weightless checkpoints), one
item per image with its own rows and model tensors, as a gateway's router path sends them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tandem.engine.refusals import RefusedField
from tandem.engine.types import MediaInputs, MediaItem
from tandem.models import expand_placeholders, load_model_info, load_processor
from tandem.models.info import ModelInfo
from tandem.wire.tokenspeed import AUDIO, IMAGE, MODALITY_UNSPECIFIED, VIDEO, encode_into, tpb
from tandem.worker.tokenspeed.media import (
    check_described,
    has_pixels,
    item_digest,
    pixel_bytes,
    pixel_media,
    read_items,
    refuse_media_tokens,
)

RED, BLUE = Image.new("RGB", (64, 64), (255, 0, 0)), Image.new("RGB", (64, 64), (0, 0, 255))


def build(
    model_dir: Path, images: list[Image.Image], dtype: str = "float32"
) -> tuple[tpb.GenerateRequest, ModelInfo]:
    info = load_model_info(model_dir)
    processor = load_processor(model_dir)
    each = [processor.preprocess([image]) for image in images]
    ids = [5, *([info.anchor_token_id] * len(images)), 6, 7]
    tokens = [pre.tokens_per_image[0] for pre in each]
    ids, ranges = expand_placeholders(ids, info.anchor_token_id, tokens, info.image_token_id)
    req = tpb.GenerateRequest(request_id="m")
    req.tokenized.input_ids.extend(ids)
    for pre, (offset, length) in zip(each, ranges, strict=True):
        item = req.mm_inputs.items.add(modality=IMAGE, content_hash=b"gateway's")
        encode_into(item.encoder_input, pre.pixel_values, dtype)
        for key, value in pre.grids.items():
            encode_into(item.model_specific_tensors[key], np.asarray(value))
        if pre.patches_per_image is not None:
            encode_into(item.model_specific_tensors["patches_per_image"], pre.patches_per_image)
        item.placeholders.add(offset=offset, length=length)
        item.placeholder_token_id = info.image_token_id
    return req, info


def media(req: tpb.GenerateRequest, info: ModelInfo, vision: bool = True) -> MediaInputs:
    items = read_items(req, len(req.tokenized.input_ids), info, pixels=True)
    return pixel_media(items, info, supports_vision=vision)


@pytest.fixture(params=["qwen", "llava"])
def family_dir(request, qwen_meta_dir: Path, llava_meta_dir: Path) -> Path:
    return qwen_meta_dir if request.param == "qwen" else llava_meta_dir


def test_one_engine_item_per_wire_item_with_its_own_identity(family_dir: Path) -> None:
    req, info = build(family_dir, [RED, BLUE, RED])
    got = media(req, info)
    assert got.pixel_values is not None and got.im_token_id == info.image_token_id
    ranges = [(i.placeholders[0].offset, i.placeholders[0].length) for i in req.mm_inputs.items]
    assert [(i.offset, i.length, i.modality) for i in got.items] == [(*r, "image") for r in ranges]
    red, blue, red_again = got.hashes
    assert red == red_again != blue, "two same-size images of different colours differ"
    rows = [item.encoder_input.shape[0] for item in req.mm_inputs.items]
    assert len(got.pixel_values) == sum(rows), "the items' rows joined in prompt order"
    if "image_grid_thw" in req.mm_inputs.items[0].model_specific_tensors:
        assert got.grids["image_grid_thw"].shape == (3, 3)
    else:
        assert got.grids == {}  # LLaVA has no model tensors
    alone, _ = build(family_dir, [BLUE])
    assert media(alone, info).hashes == [blue], "the same image, the same identity"


def test_the_identity_is_the_workers_not_the_gateways(qwen_meta_dir: Path) -> None:
    req, info = build(qwen_meta_dir, [RED])
    first = media(req, info).hashes
    req.mm_inputs.items[0].content_hash = b"a different claim"
    assert media(req, info).hashes == first
    assert first == [item_digest(req.mm_inputs.items[0])]
    grid = req.mm_inputs.items[0].model_specific_tensors["image_grid_thw"]
    encode_into(grid, np.array([[1, 2, 8]], dtype=np.int64))  # the same 16 rows
    assert item_digest(req.mm_inputs.items[0]) != first[0], "model tensors are hashed too"


def test_bfloat16_pixels_are_widened(llava_meta_dir: Path) -> None:
    req, info = build(llava_meta_dir, [RED], dtype="bfloat16")
    got = media(req, info)
    assert got.pixel_values is not None and got.pixel_values.dtype == np.float32


def test_a_batched_image_may_come_without_its_batch_axis(llava_meta_dir: Path) -> None:
    req, info = build(llava_meta_dir, [RED, BLUE])
    for item in req.mm_inputs.items:
        del item.encoder_input.shape[0]  # [1, 3, H, W] → [3, H, W], same bytes
    got = media(req, info)
    assert got.pixel_values is not None and got.pixel_values.shape[0] == 2


def test_unspecified_modality_reads_as_image(qwen_meta_dir: Path) -> None:
    req, info = build(qwen_meta_dir, [RED])
    req.mm_inputs.items[0].modality = MODALITY_UNSPECIFIED
    assert len(media(req, info).items) == 1


@pytest.mark.parametrize(("modality", "name"), [(VIDEO, "VIDEO"), (AUDIO, "AUDIO")])
def test_video_and_audio_are_refused_by_name(qwen_meta_dir: Path, modality, name: str) -> None:
    req, info = build(qwen_meta_dir, [RED])
    req.mm_inputs.items[0].modality = modality
    with pytest.raises(RefusedField, match=f"modality {name}") as refused:
        media(req, info)
    assert refused.value.code == "multimodal_not_supported"


def _second_item_over_the_first(req: tpb.GenerateRequest) -> None:
    first = req.mm_inputs.items[0].placeholders[0]
    req.mm_inputs.items[1].placeholders[0].offset = first.offset


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda r: r.mm_inputs.items[0].ClearField("placeholders"), r"items\[0\] has no placeh"),
        (lambda r: setattr(r.mm_inputs.items[0].placeholders[0], "length", 0), "is empty"),
        (lambda r: setattr(r.mm_inputs.items[1].placeholders[0], "offset", 10_000), "outside"),
        (_second_item_over_the_first, "overlap"),
        (lambda r: r.mm_inputs.items.reverse(), "prompt order"),
        (lambda r: setattr(r.mm_inputs.items[1], "placeholder_token_id", 3), "token_id 3"),
        (lambda r: setattr(r.mm_inputs.items[0], "modality", 42), "unsupported multimodal"),
        (lambda r: setattr(r.mm_inputs.items[0].encoder_input, "dtype", "float64"), "dtype"),
        (lambda r: setattr(r.mm_inputs.items[0].encoder_input, "inline", b"\0"), "mismatch"),
        (lambda r: r.mm_inputs.items[1].ClearField("encoder_input"), r"items\[1\] has no encod"),
        (
            lambda r: encode_into(
                r.mm_inputs.items[0].model_specific_tensors["video_grid_thw"],
                np.array([[1, 2, 2]], dtype=np.int64),
            ),
            "video_grid_thw",
        ),
        (
            lambda r: encode_into(
                r.mm_inputs.items[0].encoder_input, np.zeros((3, 4), dtype=np.int64)
            ),
            "float32 or bfloat16",
        ),
    ],
)
def test_malformed_items_are_refused(qwen_meta_dir: Path, change, words: str) -> None:
    req, info = build(qwen_meta_dir, [RED, BLUE])
    change(req)
    with pytest.raises(ValueError, match=words):
        media(req, info)


def test_rows_must_match_the_items_grid(qwen_meta_dir: Path) -> None:
    req, info = build(qwen_meta_dir, [RED])
    grid = req.mm_inputs.items[0].model_specific_tensors["image_grid_thw"]
    encode_into(grid, np.array([[1, 2, 2]], dtype=np.int64))
    with pytest.raises(ValueError, match="rows; its image needs 4"):
        media(req, info)


def test_several_ranges_of_one_item_make_one_span(qwen_meta_dir: Path) -> None:
    req, info = build(qwen_meta_dir, [RED])
    only = req.mm_inputs.items[0].placeholders[0]
    offset, length = only.offset, only.length
    only.length = 2
    req.mm_inputs.items[0].placeholders.add(offset=offset + 2, length=length - 2)
    assert [(i.offset, i.length) for i in media(req, info).items] == [(offset, length)]


def test_a_language_model_only_worker_refuses_pixels(llava_meta_dir: Path) -> None:
    req, info = build(llava_meta_dir, [RED])
    with pytest.raises(ValueError, match="--language-model-only"):
        media(req, info, vision=False)


def test_image_tokens_without_items_are_refused(qwen_meta_dir: Path) -> None:
    req, info = build(qwen_meta_dir, [RED])
    with pytest.raises(ValueError, match=r"no mm_inputs\.items"):
        refuse_media_tokens(list(req.tokenized.input_ids), info)
    refuse_media_tokens([5, 6, 7], info)


def test_a_decode_leg_reads_the_metadata_only(qwen_meta_dir: Path) -> None:
    req, info = build(qwen_meta_dir, [RED, BLUE])
    assert has_pixels(req) and pixel_bytes(req) > 0
    n_ids = len(req.tokenized.input_ids)
    items = read_items(req, n_ids, info, pixels=False)
    assert [i.pixels for i in items] == [None, None], "pixels sent to a decode leg are not read"
    for item in req.mm_inputs.items:
        item.ClearField("encoder_input")
    assert not has_pixels(req) and pixel_bytes(req) == 0
    items = read_items(req, n_ids, info, pixels=False)
    described = MediaInputs([MediaItem("a", 0, 1), MediaItem("b", 2, 1)])
    check_described(items, described)
    with pytest.raises(ValueError, match="carries 2 mm_inputs item"):
        check_described(items, MediaInputs([MediaItem("a", 0, 1)]))
    with pytest.raises(ValueError, match="holds KV for 0"):
        check_described(items, None)
    check_described([], None)
    req.mm_inputs.items[0].modality = VIDEO  # the metadata is still checked
    with pytest.raises(RefusedField, match="VIDEO"):
        read_items(req, n_ids, info, pixels=False)
