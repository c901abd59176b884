"""Precomputed image features (E/P/D): a prefill that takes an image's features from an
encode worker computes exactly what a prefill from the image's pixels computes, runs no
vision tower, and refuses features that this model's encoder would not have made."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from tandem.engine.core import EmbeddedEngine
from tandem.engine.kv_store import KvStore
from tandem.engine.prefix_cache import PrefixCache
from tandem.engine.runner import MediaLayoutError, ModelRunner, VisionUnavailableError
from tandem.engine.types import ImageFeatures, MediaInputs, MediaItem
from tandem.models import load_processor

PromptFactory = Callable[..., Any]  # tests/unit/engine/conftest.py: make_prompt
MODELS = ["tiny-qwen3-vl", "tiny-llava-1.5"]


def image_features(
    runner: ModelRunner, model_dir: Path, pictures: list[Image.Image]
) -> dict[int, ImageFeatures]:
    """Each picture encoded on its own, as an encode worker gets it (its own preprocessing)."""
    processor = load_processor(model_dir)
    features = {}
    for k, picture in enumerate(pictures):
        pre = processor.preprocess([picture])
        grid = pre.grids.get("image_grid_thw")
        features[k] = runner.encode_image(pre.pixel_values, None if grid is None else grid[0])
    return features


def with_features(prompt: Any, features: dict[int, ImageFeatures], pixels: bool) -> MediaInputs:
    assert prompt.media is not None
    media = prompt.without_pixels()
    assert media is not None
    media.features = features
    if pixels:
        media.pixel_values = prompt.media.pixel_values
    return media


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("pictures", [["red_circle"], ["blue_circle", "green_triangle"]])
def test_featured_prefill_is_bit_identical_and_runs_no_tower(
    name: str,
    pictures: list[str],
    runners: dict[str, ModelRunner],
    builtin_dirs: dict[str, Path],
    make_prompt: PromptFactory,
    images: dict[str, Any],
) -> None:
    runner = runners[name]
    chosen = [images[p] for p in pictures]
    prompt = make_prompt(name, chosen, "What do you see?")
    from_pixels, state = runner.prefill(prompt.ids, prompt.media)
    features = image_features(runner, builtin_dirs[name], chosen)
    if name == "tiny-qwen3-vl":
        assert all(len(f.deepstack) == runner.deepstack_layers == 2 for f in features.values())
    before = runner.vision_encodes
    featured, featured_state = runner.prefill(prompt.ids, with_features(prompt, features, False))
    assert runner.vision_encodes == before
    assert torch.equal(featured, from_pixels)
    assert featured_state.rope_delta == state.rope_delta
    for (k1, v1), (k2, v2) in zip(featured_state.kv, state.kv, strict=True):
        assert torch.equal(k1, k2) and torch.equal(v1, v2)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("compact", [False, True])
def test_one_image_featured_the_other_from_pixels(
    name: str,
    compact: bool,
    runners: dict[str, ModelRunner],
    builtin_dirs: dict[str, Path],
    make_prompt: PromptFactory,
    images: dict[str, Any],
) -> None:
    """The pixels may hold every image's rows or only those of the images without features."""
    runner = runners[name]
    chosen = [images["red_square"], images["blue_circle"]]
    prompt = make_prompt(name, chosen, "Left or right?")
    assert prompt.media is not None and prompt.media.pixel_values is not None
    expected, _ = runner.prefill(prompt.ids, prompt.media)
    second = image_features(runner, builtin_dirs[name], chosen)[1]
    media = with_features(prompt, {1: second}, pixels=True)
    if compact:
        first_rows = len(media.pixel_values) // 2  # both pictures are 128x128
        assert media.pixel_values is not None
        media.pixel_values = media.pixel_values[:first_rows]
    before = runner.vision_encodes
    logits, _ = runner.prefill(prompt.ids, media)
    assert runner.vision_encodes == before + 1
    assert torch.equal(logits, expected)


@pytest.mark.parametrize("name", MODELS)
def test_a_language_model_only_runner_prefills_with_features(
    name: str,
    runners: dict[str, ModelRunner],
    builtin_dirs: dict[str, Path],
    make_prompt: PromptFactory,
    images: dict[str, Any],
) -> None:
    lmo = ModelRunner.load(builtin_dirs[name], language_model_only=True)
    chosen = [images["red_circle"], images["green_triangle"]]
    prompt = make_prompt(name, chosen, "What do you see?")
    expected, _ = runners[name].prefill(prompt.ids, prompt.media)
    features = image_features(runners[name], builtin_dirs[name], chosen)
    logits, _ = lmo.prefill(prompt.ids, with_features(prompt, features, False))
    assert torch.equal(logits, expected)  # the very same decoder weights and inputs
    assert lmo.vision_encodes == 0
    with pytest.raises(VisionUnavailableError):
        lmo.prefill(prompt.ids, with_features(prompt, {0: features[0]}, True))
    with pytest.raises(VisionUnavailableError):
        lmo.encode_image(np.zeros((64, 1536), np.float32), np.array([1, 8, 8]))


def _reshaped(features: ImageFeatures, tokens: int = 0, hidden: int = 0) -> ImageFeatures:
    def cut(t: torch.Tensor) -> torch.Tensor:
        return torch.zeros(t.shape[0] + tokens, t.shape[1] + hidden)

    return ImageFeatures(cut(features.embeds), [cut(t) for t in features.deepstack])


@pytest.mark.parametrize("name", MODELS)
def test_features_of_the_wrong_shape_are_refused(
    name: str,
    runners: dict[str, ModelRunner],
    builtin_dirs: dict[str, Path],
    make_prompt: PromptFactory,
    images: dict[str, Any],
) -> None:
    runner = runners[name]
    prompt = make_prompt(name, [images["red"]], "What is it?")
    good = image_features(runner, builtin_dirs[name], [images["red"]])[0]
    cases: list[tuple[ImageFeatures, str]] = [
        (_reshaped(good, tokens=-1), r"embeds has shape \[\d+, 64\].*gives \[\d+, 64\]"),
        (_reshaped(good, hidden=8), r"embeds has shape \[\d+, 72\].*hidden size"),
        (dataclasses.replace(good, embeds=good.embeds.to(torch.int64)), "not floating point"),
    ]
    if good.deepstack:
        cases.append((dataclasses.replace(good, deepstack=good.deepstack[:1]), "DeepStack"))
    else:
        cases.append((dataclasses.replace(good, deepstack=[good.embeds]), "DeepStack"))
    for features, message in cases:
        with pytest.raises(MediaLayoutError, match=message):
            runner.prefill(prompt.ids, with_features(prompt, {0: features}, False))
    for index in (1, -1):
        with pytest.raises(MediaLayoutError, match="request has 1 item"):
            runner.prefill(prompt.ids, with_features(prompt, {index: good}, False))
    wrong_rows = with_features(prompt, {0: good}, True)
    assert wrong_rows.pixel_values is not None
    wrong_rows.pixel_values = np.concatenate([wrong_rows.pixel_values] * 2)
    with pytest.raises(MediaLayoutError, match=r"every image.*without features"):
        runner.prefill(prompt.ids, wrong_rows)


def test_features_converted_to_the_models_dtype(
    runners: dict[str, ModelRunner],
    builtin_dirs: dict[str, Path],
    make_prompt: PromptFactory,
    images: dict[str, Any],
) -> None:
    runner = runners["tiny-qwen3-vl"]
    prompt = make_prompt("tiny-qwen3-vl", [images["red"]], "What is it?")
    good = image_features(runner, builtin_dirs["tiny-qwen3-vl"], [images["red"]])[0]
    as_double = ImageFeatures(good.embeds.double(), [t.double() for t in good.deepstack])
    logits, _ = runner.prefill(prompt.ids, with_features(prompt, {0: as_double}, False))
    expected, _ = runner.prefill(prompt.ids, prompt.media)
    assert torch.equal(logits, expected)  # float32 → float64 → float32 is exact


def test_a_video_takes_no_features(runners: dict[str, ModelRunner]) -> None:
    runner = runners["tiny-qwen3-vl"]
    features = ImageFeatures(torch.zeros(4, 64), [torch.zeros(4, 64)] * 2)
    media = MediaInputs(
        [MediaItem("v", 0, 4, "video")],
        grids={"video_grid_thw": np.array([[2, 4, 4]])},
        features={0: features},
    )
    with pytest.raises(MediaLayoutError, match="media item 0 is a video"):
        runner.prefill([runner.info.video_token_id or 0] * 4, media)


@pytest.mark.parametrize("name", MODELS)
def test_different_colours_give_different_features(
    name: str, runners: dict[str, ModelRunner], builtin_dirs: dict[str, Path], images: Any
) -> None:
    both = image_features(runners[name], builtin_dirs[name], [images["red"], images["blue"]])
    red, blue = both[0], both[1]
    assert red.embeds.shape == blue.embeds.shape
    assert not torch.allclose(red.embeds, blue.embeds)


def test_encode_image_checks_pixels_against_the_grid(runners: dict[str, ModelRunner]) -> None:
    qwen, llava = runners["tiny-qwen3-vl"], runners["tiny-llava-1.5"]
    before = qwen.vision_encodes
    with pytest.raises(MediaLayoutError, match="grid"):
        qwen.encode_image(np.zeros((64, 1536), np.float32), None)
    with pytest.raises(MediaLayoutError, match="needs 64"):
        qwen.encode_image(np.zeros((60, 1536), np.float32), np.array([[1, 8, 8]]))
    with pytest.raises(MediaLayoutError, match="not a valid merged grid"):
        qwen.encode_image(np.zeros((63, 1536), np.float32), np.array([1, 7, 9]))
    assert qwen.vision_encodes == before  # refused before the tower
    with pytest.raises(MediaLayoutError, match="takes no image grid"):
        llava.encode_image(np.zeros((1, 3, 64, 64), np.float32), np.array([1, 8, 8]))
    with pytest.raises(MediaLayoutError, match="batch of 1"):
        llava.encode_image(np.zeros((2, 3, 64, 64), np.float32), None)


def test_the_engine_counts_vision_encodes(runners: dict[str, ModelRunner]) -> None:
    runner = runners["tiny-llava-1.5"]
    engine = EmbeddedEngine(runner, PrefixCache(runner.shape, 1 << 20), KvStore(runner.shape))
    before = engine.counters()["vision_encodes"]
    assert before == runner.vision_encodes
    runner.encode_image(np.zeros((3, 64, 64), np.float32), None)
    assert engine.counters()["vision_encodes"] == before + 1
