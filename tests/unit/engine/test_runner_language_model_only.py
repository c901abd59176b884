"""Language-model-only loading: no vision tower at all, the very same decoder weights."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tandem.engine.loader import LanguageModelOnly, load_model
from tandem.engine.runner import ModelRunner, VisionUnavailableError

VISION_WORDS = ("visual", "vision", "multi_modal_projector", "merger", "patch_embed")


@pytest.mark.parametrize("name", ["tiny-qwen3-vl", "tiny-llava-1.5"])
def test_no_vision_module_is_constructed(name: str, builtin_dirs: dict[str, Path]) -> None:
    model = load_model(builtin_dirs[name], language_model_only=True)
    assert isinstance(model, LanguageModelOnly)
    names = [n for n, _ in model.named_modules()] + [n for n, _ in model.named_parameters()]
    assert not [n for n in names if any(word in n for word in VISION_WORDS)]
    assert not model.training


@pytest.mark.parametrize("name", ["tiny-qwen3-vl", "tiny-llava-1.5"])
def test_parameters_equal_the_full_models_language_part(
    name: str, builtin_dirs: dict[str, Path], runners: dict[str, ModelRunner]
) -> None:
    lmo = dict(load_model(builtin_dirs[name], language_model_only=True).named_parameters())
    full = dict(runners[name].model.named_parameters())
    language = {
        n: p for n, p in full.items() if n.startswith(("model.language_model.", "lm_head."))
    }
    assert set(lmo) == set(language)
    assert len(full) > len(language)  # the full model does have a vision part
    for n, p in lmo.items():
        assert p.dtype == torch.float32
        assert torch.equal(p, language[n]), n


@pytest.mark.parametrize("name", ["tiny-qwen3-vl", "tiny-llava-1.5"])
def test_lmo_runner_capabilities(name: str, builtin_dirs: dict[str, Path]) -> None:
    full = ModelRunner.load(builtin_dirs[name])
    lmo = ModelRunner.load(builtin_dirs[name], language_model_only=True)
    assert full.supports_vision and not lmo.supports_vision
    assert lmo.shape == full.shape
    assert lmo.eos_token_ids == full.eos_token_ids
    assert lmo.model_type == full.model_type == {"tiny-qwen3-vl": "qwen3_vl"}.get(name, "llava")


@pytest.mark.parametrize("name", ["tiny-qwen3-vl", "tiny-llava-1.5"])
def test_lmo_runner_refuses_to_compute_image_tokens(
    name: str,
    builtin_dirs: dict[str, Path],
    make_prompt: Callable[..., Any],
    images: dict[str, Any],
) -> None:
    lmo = ModelRunner.load(builtin_dirs[name], language_model_only=True)
    prompt = make_prompt(name, [images["red"]], "What is it?")
    with pytest.raises(VisionUnavailableError, match="language model only"):
        lmo.prefill(prompt.ids, prompt.media)


@pytest.mark.parametrize("name", ["tiny-qwen3-vl", "tiny-llava-1.5"])
def test_lmo_text_prefill_equals_full(
    name: str,
    builtin_dirs: dict[str, Path],
    runners: dict[str, ModelRunner],
    make_prompt: Callable[..., Any],
) -> None:
    lmo = ModelRunner.load(builtin_dirs[name], language_model_only=True)
    prompt = make_prompt(name, [], "Plain text only.")
    lmo_logits, _ = lmo.prefill(prompt.ids, None)
    full_logits, _ = runners[name].prefill(prompt.ids, None)
    torch.testing.assert_close(lmo_logits, full_logits, atol=1e-5, rtol=0)
