"""An MLX request read as MLX's servicer reads it (worker/mlx/inputs.py): tokenized input
only, temperature unset as 1.0, the plain numbers' 0 as off, ``max_tokens`` unset filling
the context, ``logprobs`` as alternatives, the stop ids; and each refusal naming its field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tandem.models.info import ModelInfo, load_model_info
from tandem.wire.mlx import mpb
from tandem.worker.mlx.inputs import (
    prompt_ids,
    refuse_media_tokens,
    sampling_config,
    stop_ids,
)

CONTEXT, VOCAB = 64, 100


@pytest.fixture(scope="module")
def model(qwen_meta_dir: Path) -> ModelInfo:
    return load_model_info(qwen_meta_dir)


def request(ids: list[int] | None = None, **sampling: Any) -> mpb.GenerateRequest:
    req = mpb.GenerateRequest(request_id="r")
    req.tokenized.input_ids.extend([5, 6, 7] if ids is None else ids)
    for name, value in sampling.items():
        if name == "logit_bias":
            req.sampling_params.logit_bias.update(value)
        elif name == "stop_token_ids":
            req.sampling_params.stop_token_ids.extend(value)
        else:
            setattr(req.sampling_params, name, value)
    return req


def test_unset_fields() -> None:
    config = sampling_config(request(), 3, CONTEXT, VOCAB)
    assert config.temperature == 1.0, "unset: 1.0, as MLX's servicer (mlx-lm alone: greedy)"
    assert (config.top_p, config.top_k, config.min_p) == (1.0, 0, 0.0)
    assert config.repetition_penalty == 1.0, "0: no penalty"
    assert (config.frequency_penalty, config.presence_penalty) == (0.0, 0.0)
    assert config.max_tokens == CONTEXT - 3, "unset: the rest of the context"
    assert config.logprobs is None and config.seed is None and not config.ignore_eos


def test_sent_fields() -> None:
    config = sampling_config(
        request(
            temperature=0.0,
            top_p=0.5,
            top_k=4,
            min_p=0.25,
            repetition_penalty=1.5,
            frequency_penalty=0.5,
            presence_penalty=-1.0,
            max_tokens=500,
            logprobs=3,
            seed=-7,
            ignore_eos=True,
            logit_bias={9: 2.0, 3: -1.0},
            stop_token_ids=[4],
        ),
        3,
        CONTEXT,
        VOCAB,
    )
    assert config.temperature == 0.0 and config.greedy
    assert (config.top_p, config.top_k, config.min_p) == (0.5, 4, 0.25)
    assert (config.repetition_penalty, config.frequency_penalty) == (1.5, 0.5)
    assert config.presence_penalty == -1.0
    assert config.max_tokens == CONTEXT - 3, "capped at the context"
    assert (config.logprobs, config.seed, config.ignore_eos) == (3, -7, True)
    assert config.logit_bias == ((3, -1.0), (9, 2.0)) and config.stop_token_ids == (4,)
    assert sampling_config(request(logprobs=0), 3, CONTEXT, VOCAB).logprobs is None
    assert sampling_config(request(top_p=1.0), 3, CONTEXT, VOCAB).top_p == 1.0


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"top_p": 1.5}, "sampling_params.top_p must be in [0, 1]"),
        ({"min_p": -0.1}, "sampling_params.min_p must be in [0, 1]"),
        ({"temperature": -1.0}, "sampling_params.temperature must be >= 0"),
        ({"temperature": float("nan")}, "sampling_params.temperature"),
        ({"repetition_penalty": -1.0}, "sampling_params.repetition_penalty must be > 0"),
        ({"frequency_penalty": 3.0}, "frequency_penalty must be in [-2, 2]"),
        ({"logprobs": 21}, "sampling_params.logprobs must be in 0..20"),
        ({"logprobs": -1}, "sampling_params.logprobs"),
        ({"max_tokens": 0}, "sampling_params.max_tokens must be at least 1"),
        ({"logit_bias": {VOCAB: 1.0}}, f"logit_bias names token ids [{VOCAB}]"),
        ({"stop_token_ids": [VOCAB + 1]}, "sampling_params.stop_token_ids"),
    ],
)
def test_refusals_name_the_field(fields: dict[str, Any], words: str) -> None:
    with pytest.raises(ValueError) as info:
        sampling_config(request(**fields), 3, CONTEXT, VOCAB)
    assert words in str(info.value)


def test_a_prompt_that_fills_the_context_is_refused() -> None:
    with pytest.raises(ValueError, match="leaves no room in the context of 64"):
        sampling_config(request(list(range(CONTEXT))), CONTEXT, CONTEXT, VOCAB)


def test_only_tokenized_input_is_taken() -> None:
    assert prompt_ids(request([1, 2])) == [1, 2]
    with pytest.raises(ValueError, match=r"requires tokenized input.*got text"):
        prompt_ids(mpb.GenerateRequest(text="Hi"))
    with pytest.raises(ValueError, match="got no input"):
        prompt_ids(mpb.GenerateRequest())
    with pytest.raises(ValueError, match="input_ids is empty"):
        prompt_ids(request([]))


def test_media_placeholders_are_refused(model: ModelInfo) -> None:
    refuse_media_tokens([1, 2, 3], model)
    with pytest.raises(ValueError, match="holds 2 image or video placeholder"):
        refuse_media_tokens([1, model.image_token_id, 3, model.image_token_id], model)
    assert model.video_token_id is not None
    with pytest.raises(ValueError, match="carries no media"):
        refuse_media_tokens([model.video_token_id], model)


def test_the_stop_ids_follow_ignore_eos(model: ModelInfo) -> None:
    eos = set(model.eos_token_ids)
    assert stop_ids(request(stop_token_ids=[4]), model) == {4, *eos}
    assert stop_ids(request(stop_token_ids=[4], ignore_eos=True), model) == {4}
