"""The runner's manual prefill/decode loop equals transformers' own greedy generate."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from tandem.engine.runner import ModelRunner
from tandem.engine.runner_positions import mrope_positions

N_TOKENS = 10


def _hf_inputs(runner: ModelRunner, prompt: Any) -> dict[str, Any]:
    ids = torch.tensor([prompt.ids])
    kwargs: dict[str, Any] = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if prompt.media is not None:
        kwargs["pixel_values"] = torch.from_numpy(prompt.media.pixel_values)
        if runner.family.has_mrope:
            kwargs["image_grid_thw"] = torch.from_numpy(prompt.media.grids["image_grid_thw"])
            kwargs["mm_token_type_ids"] = (ids == runner.info.image_token_id).int()
    return kwargs


def _hf_generate(runner: ModelRunner, prompt: Any) -> list[int]:
    with torch.inference_mode():
        out = runner.model.generate(
            **_hf_inputs(runner, prompt),
            max_new_tokens=N_TOKENS,
            min_new_tokens=N_TOKENS,
            do_sample=False,
        )
    return out[0, len(prompt.ids) :].tolist()


@pytest.mark.parametrize("name", ["tiny-qwen3-vl", "tiny-llava-1.5"])
@pytest.mark.parametrize("image_names", [[], ["gradient_wide"], ["checker", "blue"]])
def test_runner_matches_hf_generate(
    name: str,
    image_names: list[str],
    runners: dict[str, ModelRunner],
    make_prompt: Callable[..., Any],
    images: dict[str, Any],
    greedy: Callable[..., list[int]],
) -> None:
    runner = runners[name]
    prompt = make_prompt(name, [images[i] for i in image_names], "Tell me a story.")
    logits, state = runner.prefill(prompt.ids, prompt.media)
    with torch.inference_mode():
        hf_logits = runner.model(**_hf_inputs(runner, prompt)).logits[0, -1]
    torch.testing.assert_close(logits, hf_logits, atol=1e-4, rtol=0)
    assert greedy(runner, logits, state, N_TOKENS) == _hf_generate(runner, prompt)


def test_mrope_positions_match_hf_rope_index(
    runners: dict[str, ModelRunner], make_prompt: Callable[..., Any], images: dict[str, Any]
) -> None:
    runner = runners["tiny-qwen3-vl"]
    prompt = make_prompt("tiny-qwen3-vl", [images["gradient_wide"], images["big"]], "Two.")
    ids = torch.tensor([prompt.ids])
    grid = prompt.media.grids["image_grid_thw"]
    expected, expected_delta = runner.model.model.get_rope_index(
        ids,
        mm_token_type_ids=(ids == runner.info.image_token_id).int(),
        image_grid_thw=torch.from_numpy(grid),
    )
    spans = [(item.offset, item.length) for item in prompt.media.items]
    positions, delta = mrope_positions(len(prompt.ids), spans, grid, merge=2)
    np.testing.assert_array_equal(positions, expected[:, 0].numpy())
    assert delta == int(expected_delta[0, 0])
