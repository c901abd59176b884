"""Disaggregation is invisible: the decode worker's path gives the aggregated tokens.

(a) one worker: prefill the whole prompt, then decode.
(b) PD: worker A prefills ``ids[:-1]``; a separate runner B (language model only,
as a decode worker may be) gets a copy of that KV plus the pixel-less media and
computes only the last prompt token before decoding.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tandem.engine.runner import ModelRunner

N_TOKENS = 12

CASES = [
    ("tiny-qwen3-vl", [], "Write a short poem about the sea."),
    ("tiny-qwen3-vl", ["gradient_wide"], "What is in this image?"),
    ("tiny-qwen3-vl", ["big", "checker"], "Compare the two images."),
    ("tiny-llava-1.5", [], "Write a short poem about the sea."),
    ("tiny-llava-1.5", ["gradient"], "What is in this image?"),
    ("tiny-llava-1.5", ["red", "checker"], "Compare the two images."),
]


@pytest.fixture(scope="module")
def decode_runners(builtin_dirs: dict[str, Path]) -> dict[str, ModelRunner]:
    return {name: ModelRunner.load(d, language_model_only=True) for name, d in builtin_dirs.items()}


@pytest.mark.parametrize(("name", "image_names", "text"), CASES)
def test_pd_handoff_matches_aggregated(
    name: str,
    image_names: list[str],
    text: str,
    runners: dict[str, ModelRunner],
    decode_runners: dict[str, ModelRunner],
    make_prompt: Callable[..., Any],
    images: dict[str, Any],
    greedy: Callable[..., list[int]],
) -> None:
    prompt = make_prompt(name, [images[i] for i in image_names], text)
    prefill_worker, decode_worker = runners[name], decode_runners[name]

    logits, state = prefill_worker.prefill(prompt.ids, prompt.media)
    aggregated = greedy(prefill_worker, logits, state, N_TOKENS)

    _, exported = prefill_worker.prefill(prompt.ids[:-1], prompt.media)
    pulled = [(k.clone(), v.clone()) for k, v in exported.kv]
    logits_b, state_b = decode_worker.prefill(prompt.ids, prompt.without_pixels(), cached=pulled)
    disaggregated = greedy(decode_worker, logits_b, state_b, N_TOKENS)

    assert disaggregated == aggregated
    assert state_b.length == state.length == len(prompt.ids) + N_TOKENS - 1
    assert state_b.rope_delta == state.rope_delta


def test_qwen_image_prompt_has_nonzero_rope_delta(
    runners: dict[str, ModelRunner], make_prompt: Callable[..., Any], images: dict[str, Any]
) -> None:
    # Guards the test above: with M-RoPE the decode worker must really use the grids.
    prompt = make_prompt("tiny-qwen3-vl", [images["big"]], "Describe.")
    _, state = runners["tiny-qwen3-vl"].prefill(prompt.ids, prompt.media)
    assert state.rope_delta == 8 - 64  # a 16x16-patch image: 64 tokens over 8 positions


def test_prefill_state_covers_prompt_with_engine_layout(
    runners: dict[str, ModelRunner], make_prompt: Callable[..., Any], images: dict[str, Any]
) -> None:
    for name, runner in runners.items():
        prompt = make_prompt(name, [images["red"]], "Hi")
        logits, state = runner.prefill(prompt.ids, prompt.media)
        shape = runner.shape
        assert logits.shape == (shape.vocab_size,)
        assert len(state.kv) == shape.num_layers
        for k, v in state.kv:
            assert k.shape == v.shape == (shape.num_kv_heads, len(prompt.ids), shape.head_dim)
        assert state.length == len(prompt.ids)


def test_decode_never_writes_into_earlier_kv(
    runners: dict[str, ModelRunner], make_prompt: Callable[..., Any]
) -> None:
    # Prefix-cache blocks and exported KV keep views of these tensors.
    runner = runners["tiny-llava-1.5"]
    prompt = make_prompt("tiny-llava-1.5", [], "Hello there")
    logits, state = runner.prefill(prompt.ids, None)
    before = [(k, v, k.clone(), v.clone()) for k, v in state.kv]
    runner.decode_step(state, int(logits.argmax()))
    for k, v, k0, v0 in before:
        assert k.shape[1] == len(prompt.ids)
        assert (k == k0).all() and (v == v0).all()
    assert state.kv[0][0].shape[1] == len(prompt.ids) + 1
