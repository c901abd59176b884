"""The built-in models look at their images: same text, different image → different answer.

Every isolation test (prefix cache, decode-leg identity) relies on this; a model
that ignored its images would let image mix-ups pass unnoticed.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest

from tandem.engine.runner import ModelRunner

N_TOKENS = 8
SAME_SIZE = ["red", "blue", "white", "gradient"]  # all 128x128: identical prompt ids


@pytest.mark.parametrize("name", ["tiny-qwen3-vl", "tiny-llava-1.5"])
def test_different_images_give_different_greedy_outputs(
    name: str,
    runners: dict[str, ModelRunner],
    make_prompt: Callable[..., Any],
    images: dict[str, Any],
    greedy: Callable[..., list[int]],
) -> None:
    runner = runners[name]
    outputs: dict[str, list[int]] = {}
    prompt_ids = set()
    for image in SAME_SIZE:
        prompt = make_prompt(name, [images[image]], "What do you see?")
        prompt_ids.add(tuple(prompt.ids))
        logits, state = runner.prefill(prompt.ids, prompt.media)
        outputs[image] = greedy(runner, logits, state, N_TOKENS)
    assert len(prompt_ids) == 1  # only the pixels differ
    for a, b in itertools.combinations(SAME_SIZE, 2):
        assert outputs[a] != outputs[b], f"{name}: {a} and {b} gave the same answer"


@pytest.mark.parametrize("name", ["tiny-qwen3-vl", "tiny-llava-1.5"])
def test_image_order_matters(
    name: str,
    runners: dict[str, ModelRunner],
    make_prompt: Callable[..., Any],
    images: dict[str, Any],
    greedy: Callable[..., list[int]],
) -> None:
    runner = runners[name]
    answers = []
    for pair in (["red", "blue"], ["blue", "red"]):
        prompt = make_prompt(name, [images[i] for i in pair], "Left or right?")
        logits, state = runner.prefill(prompt.ids, prompt.media)
        answers.append(greedy(runner, logits, state, N_TOKENS))
    assert answers[0] != answers[1]


@pytest.mark.parametrize("name", ["tiny-qwen3-vl", "tiny-llava-1.5"])
def test_text_changes_output(
    name: str,
    runners: dict[str, ModelRunner],
    make_prompt: Callable[..., Any],
    greedy: Callable[..., list[int]],
) -> None:
    runner = runners[name]
    answers = []
    for text in ("Hello", "Goodbye"):
        prompt = make_prompt(name, [], text)
        logits, state = runner.prefill(prompt.ids, None)
        answers.append(greedy(runner, logits, state, N_TOKENS))
    assert answers[0] != answers[1]
