"""The built-in models look at their images: same text, different picture → different answer,
and the answer names what is in the picture.

Every isolation test (prefix cache, decode-leg identity) relies on this; a model
that ignored its images would let image mix-ups pass unnoticed.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
import torch

from tandem.engine.builtin_shapes import TEXT_ONLY_REPLY, answer
from tandem.engine.runner import ModelRunner

# The same four as the ``images`` fixture's pictures (tests/unit/engine/conftest.py).
PICTURES = (("red", "circle"), ("blue", "circle"), ("red", "square"), ("green", "triangle"))
N_TOKENS = 24  # longer than any answer, so the end-of-turn token is in it


def _text(runner: ModelRunner, tokens: list[int]) -> str:
    """The reply up to its end-of-turn token (byte-level ids: id == byte below 256)."""
    end = next((i for i, t in enumerate(tokens) if t in runner.eos_token_ids), None)
    assert end is not None, f"no end-of-turn token in {tokens}"
    return bytes(tokens[:end]).decode("utf-8").strip()


@pytest.mark.parametrize("name", ["tiny-qwen3-vl", "tiny-llava-1.5"])
def test_different_pictures_give_their_own_answers(
    name: str,
    runners: dict[str, ModelRunner],
    make_prompt: Callable[..., Any],
    images: dict[str, Any],
    greedy: Callable[..., list[int]],
) -> None:
    runner = runners[name]
    outputs: dict[tuple[str, str], list[int]] = {}
    prompt_ids = set()
    for colour, shape in PICTURES:  # all 128x128: identical prompt ids
        prompt = make_prompt(name, [images[f"{colour}_{shape}"]], "What do you see?")
        prompt_ids.add(tuple(prompt.ids))
        logits, state = runner.prefill(prompt.ids, prompt.media)
        outputs[colour, shape] = greedy(runner, logits, state, N_TOKENS)
    assert len(prompt_ids) == 1  # only the pixels differ
    for picture, tokens in outputs.items():
        assert _text(runner, tokens) == answer(*picture)
    for a, b in itertools.combinations(PICTURES, 2):
        assert outputs[a] != outputs[b], f"{name}: {a} and {b} gave the same answer"


@pytest.mark.parametrize("name", ["tiny-qwen3-vl", "tiny-llava-1.5"])
def test_image_order_matters(
    name: str,
    runners: dict[str, ModelRunner],
    make_prompt: Callable[..., Any],
    images: dict[str, Any],
) -> None:
    """Two pictures in either order: the model was trained on one picture at a time, so its
    words may not change, but what it computes must (each picture at its own positions)."""
    runner = runners[name]
    logits = []
    for pair in (["red_circle", "blue_circle"], ["blue_circle", "red_circle"]):
        prompt = make_prompt(name, [images[i] for i in pair], "Left or right?")
        logits.append(runner.prefill(prompt.ids, prompt.media)[0])
    assert not torch.allclose(logits[0], logits[1], atol=1e-4)


@pytest.mark.parametrize("name", ["tiny-qwen3-vl", "tiny-llava-1.5"])
def test_text_changes_the_logits_and_gets_the_fixed_reply(
    name: str,
    runners: dict[str, ModelRunner],
    make_prompt: Callable[..., Any],
    greedy: Callable[..., list[int]],
) -> None:
    runner = runners[name]
    logits = []
    for text in ("Hello", "Goodbye"):
        prompt = make_prompt(name, [], text)
        first, state = runner.prefill(prompt.ids, None)
        logits.append(first)
        assert _text(runner, greedy(runner, first, state, 24)) == TEXT_ONLY_REPLY
    assert not torch.allclose(logits[0], logits[1], atol=1e-4)
