"""Prefix reuse: prefill on top of a block-aligned KV prefix equals a cold prefill."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from tandem.engine.runner import ModelRunner

BLOCK = 16


def _inside_image(prompt: Any, cut: int) -> bool:
    return any(item.offset < cut < item.offset + item.length for item in prompt.media.items)


@pytest.mark.parametrize("name", ["tiny-qwen3-vl", "tiny-llava-1.5"])
def test_prefix_reuse_matches_cold_prefill(
    name: str,
    runners: dict[str, ModelRunner],
    make_prompt: Callable[..., Any],
    images: dict[str, Any],
) -> None:
    runner = runners[name]
    prompt = make_prompt(name, [images["gradient"], images["checker"]], "Which one is brighter?")
    cold_logits, cold = runner.prefill(prompt.ids, prompt.media)
    # Every block boundary, so cuts fall before, inside and after the image runs.
    cuts = list(range(BLOCK, len(prompt.ids), BLOCK))
    assert sum(_inside_image(prompt, cut) for cut in cuts) >= 2
    assert sum(not _inside_image(prompt, cut) for cut in cuts) >= 2
    for cut in cuts:
        # As the prefix cache does: blocks of an earlier full prefill.
        heads = [[(k[:, :cut], v[:, :cut]) for k, v in cold.kv]]
        if not _inside_image(prompt, cut):
            # A prompt that stops between images can also be prefilled on its own.
            heads.append(runner.prefill(prompt.ids[:cut], prompt.media)[1].kv)
        for reused in heads:
            logits, warm = runner.prefill(prompt.ids, prompt.media, cached=reused)
            torch.testing.assert_close(logits, cold_logits, atol=1e-4, rtol=0)
            for (k, v), (k0, v0) in zip(warm.kv, cold.kv, strict=True):
                torch.testing.assert_close(k, k0, atol=1e-4, rtol=0)
                torch.testing.assert_close(v, v0, atol=1e-4, rtol=0)
            assert warm.rope_delta == cold.rope_delta


@pytest.mark.parametrize("name", ["tiny-qwen3-vl", "tiny-llava-1.5"])
def test_prefix_covering_all_images_needs_no_pixels(
    name: str,
    runners: dict[str, ModelRunner],
    make_prompt: Callable[..., Any],
    images: dict[str, Any],
) -> None:
    runner = runners[name]
    prompt = make_prompt(name, [images["gradient"]], "Describe the colours in detail please.")
    last_image_token = max(i for i, t in enumerate(prompt.ids) if t == runner.info.image_token_id)
    cut = (last_image_token // BLOCK + 1) * BLOCK
    assert cut < len(prompt.ids)
    cold_logits, _ = runner.prefill(prompt.ids, prompt.media)
    _, head = runner.prefill(prompt.ids[:cut], prompt.media)
    reused = [(k[:, :cut], v[:, :cut]) for k, v in head.kv]
    logits, _ = runner.prefill(prompt.ids, prompt.without_pixels(), cached=reused)
    torch.testing.assert_close(logits, cold_logits, atol=1e-4, rtol=0)


def test_prefix_of_other_image_gives_other_logits(
    runners: dict[str, ModelRunner], make_prompt: Callable[..., Any], images: dict[str, Any]
) -> None:
    # Sanity for the cache keys' purpose: a same-size image's KV is not interchangeable.
    runner = runners["tiny-qwen3-vl"]
    red = make_prompt("tiny-qwen3-vl", [images["red"]], "Describe it.")
    blue = make_prompt("tiny-qwen3-vl", [images["blue"]], "Describe it.")
    assert red.ids == blue.ids
    cut = len(red.ids) - 4
    _, blue_head = runner.prefill(blue.ids[:cut], blue.media)
    aliased, _ = runner.prefill(red.ids, red.without_pixels(), cached=blue_head.kv)
    honest, _ = runner.prefill(red.ids, red.media)
    assert not torch.allclose(aliased, honest, atol=1e-3)
