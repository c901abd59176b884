"""Requests the runner cannot serve correctly fail with clear errors, never image-blind."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from tandem.engine.runner import (
    ContextLengthError,
    MediaLayoutError,
    MissingPixelsError,
    ModelRunner,
    SequenceState,
)
from tandem.engine.types import MediaInputs, MediaItem

BOTH = ["tiny-qwen3-vl", "tiny-llava-1.5"]


@pytest.fixture(params=BOTH)
def case(
    request: pytest.FixtureRequest,
    runners: dict[str, ModelRunner],
    make_prompt: Callable[..., Any],
    images: dict[str, Any],
) -> tuple[ModelRunner, Any]:
    name = request.param
    return runners[name], make_prompt(name, [images["red"]], "What colour?")


def test_missing_pixels_on_full_prefill(case: tuple[ModelRunner, Any]) -> None:
    runner, prompt = case
    with pytest.raises(MissingPixelsError, match="no pixel values"):
        runner.prefill(prompt.ids, prompt.without_pixels())


def test_missing_pixels_when_cache_ends_inside_the_image(case: tuple[ModelRunner, Any]) -> None:
    runner, prompt = case
    cut = prompt.media.items[0].offset + 2
    _, state = runner.prefill(prompt.ids, prompt.media)
    head = [(k[:, :cut], v[:, :cut]) for k, v in state.kv]
    with pytest.raises(MissingPixelsError):
        runner.prefill(prompt.ids, prompt.without_pixels(), cached=head)


def test_prompt_ending_inside_an_image_is_refused(case: tuple[ModelRunner, Any]) -> None:
    runner, prompt = case
    cut = prompt.media.items[0].offset + 2
    with pytest.raises(MediaLayoutError, match="image tokens"):
        runner.prefill(prompt.ids[:cut], prompt.media)


def test_missing_pixels_is_a_value_error() -> None:
    assert issubclass(MissingPixelsError, ValueError)
    assert issubclass(MediaLayoutError, ValueError)


def test_image_tokens_without_any_media_to_compute(case: tuple[ModelRunner, Any]) -> None:
    runner, prompt = case
    with pytest.raises(ValueError, match="image"):
        runner.prefill(prompt.ids, None)


def test_item_count_must_match_image_tokens(case: tuple[ModelRunner, Any]) -> None:
    runner, prompt = case
    media = prompt.media
    doubled = dataclasses.replace(media, items=media.items * 2)
    with pytest.raises(MediaLayoutError):
        runner.prefill(prompt.ids, doubled)


def test_item_range_must_hold_its_tokens(case: tuple[ModelRunner, Any]) -> None:
    runner, prompt = case
    item = prompt.media.items[0]
    shifted = dataclasses.replace(
        prompt.media, items=[MediaItem("x", item.offset + 3, item.length)]
    )
    with pytest.raises(MediaLayoutError, match="placeholder range"):
        runner.prefill(prompt.ids, shifted)


def test_im_token_id_must_be_the_models(case: tuple[ModelRunner, Any]) -> None:
    runner, prompt = case
    wrong = dataclasses.replace(prompt.media, im_token_id=runner.info.image_token_id + 1)
    with pytest.raises(MediaLayoutError, match="im_token_id"):
        runner.prefill(prompt.ids, wrong)


def test_qwen_needs_grids_even_without_pixels(
    runners: dict[str, ModelRunner], make_prompt: Callable[..., Any], images: dict[str, Any]
) -> None:
    runner = runners["tiny-qwen3-vl"]
    prompt = make_prompt("tiny-qwen3-vl", [images["red"]], "Colour?")
    _, head = runner.prefill(prompt.ids[:-1], prompt.media)
    hashes_only = MediaInputs(items=list(prompt.media.items))
    with pytest.raises(MediaLayoutError, match="image_grid_thw"):
        runner.prefill(prompt.ids, hashes_only, cached=head.kv)
    with pytest.raises(MediaLayoutError, match="M-RoPE"):
        runner.prefill(prompt.ids, None, cached=head.kv)


def test_qwen_grid_must_match_token_count(
    runners: dict[str, ModelRunner], make_prompt: Callable[..., Any], images: dict[str, Any]
) -> None:
    runner = runners["tiny-qwen3-vl"]
    prompt = make_prompt("tiny-qwen3-vl", [images["red"]], "Colour?")
    wrong = dataclasses.replace(prompt.media, grids={"image_grid_thw": np.array([[1, 4, 4]])})
    with pytest.raises(MediaLayoutError):
        runner.prefill(prompt.ids, wrong)


def test_llava_decode_leg_without_media(
    runners: dict[str, ModelRunner], make_prompt: Callable[..., Any], images: dict[str, Any]
) -> None:
    # Grid-less: a decode leg with KV for every image token needs no media at all.
    runner = runners["tiny-llava-1.5"]
    prompt = make_prompt("tiny-llava-1.5", [images["red"]], "Colour?")
    expected, _ = runner.prefill(prompt.ids, prompt.media)
    _, head = runner.prefill(prompt.ids[:-1], prompt.media)
    logits, _ = runner.prefill(prompt.ids, None, cached=head.kv)
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=0)


def test_cached_kv_must_leave_a_token(case: tuple[ModelRunner, Any]) -> None:
    runner, prompt = case
    _, state = runner.prefill(prompt.ids, prompt.media)
    with pytest.raises(ValueError, match="at least the last"):
        runner.prefill(prompt.ids, prompt.media, cached=state.kv)


def test_cached_kv_shape_is_checked(case: tuple[ModelRunner, Any]) -> None:
    runner, prompt = case
    _, state = runner.prefill(prompt.ids[:5], None)
    with pytest.raises(ValueError, match="layers"):
        runner.prefill(prompt.ids, prompt.media, cached=state.kv[:1])
    bad = [(k[..., :-1], v[..., :-1]) for k, v in state.kv]  # one head_dim column short
    with pytest.raises(ValueError, match="shape"):
        runner.prefill(prompt.ids, prompt.media, cached=bad)
    half = [(k.half(), v.half()) for k, v in state.kv]
    with pytest.raises(ValueError, match="float32"):
        runner.prefill(prompt.ids, prompt.media, cached=half)


def test_context_limits(case: tuple[ModelRunner, Any]) -> None:
    runner, _ = case
    too_long = [65] * (runner.shape.max_context + 1)
    with pytest.raises(ContextLengthError):
        runner.prefill(too_long, None)
    _, state = runner.prefill([65, 66], None)
    full = SequenceState(state.kv, runner.shape.max_context)
    with pytest.raises(ContextLengthError):
        runner.decode_step(full, 65)


def test_decode_rejects_bad_token_and_stale_state(case: tuple[ModelRunner, Any]) -> None:
    runner, _ = case
    _, state = runner.prefill([65, 66, 67], None)
    with pytest.raises(ValueError, match="vocabulary"):
        runner.decode_step(state, runner.shape.vocab_size)
    stale = SequenceState(state.kv, state.length + 1)
    with pytest.raises(ValueError, match="does not cover"):
        runner.decode_step(stale, 65)


def test_empty_prompt_and_out_of_vocabulary_ids(case: tuple[ModelRunner, Any]) -> None:
    runner, _ = case
    with pytest.raises(ValueError, match="empty"):
        runner.prefill([], None)
    for bad in (-1, runner.shape.vocab_size):
        with pytest.raises(ValueError, match="vocabulary"):
            runner.prefill([65, bad], None)
