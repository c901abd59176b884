"""From an MLX ``GenerateRequest`` to the engine's prompt and sampling, read as MLX's servicer
reads them (docs/worker-protocols.md).

- Input: ``tokenized`` only; ``text`` is refused (as MLX's servicer refuses it), and so is a
  prompt holding the model's image or video placeholder tokens: the protocol carries no
  media, so such a prompt can only be an image request that lost its images.
- ``temperature`` unset is 1.0 (MLX's servicer, to sample as vLLM does); 0 is greedy.
- The plain numbers read 0 as off: ``top_p`` 0 (or 1) keeps every token, ``top_k`` 0 and
  ``min_p`` 0 filter nothing, a ``repetition_penalty`` of 0 applies none (1.0). Values MLX
  would quietly treat as off (``top_p`` above 1, a negative penalty) are refused by name
  instead: they are a caller's mistake.
- ``max_tokens`` unset fills the context left after the prompt, as MLX's servicer does; a
  given one is capped there (the engine cannot go past the context).
- ``logprobs`` is the number of alternatives per token with the sampled token's logprob;
  unset or 0 asks for none (MLX's servicer returns none then).
- ``stop_token_ids`` and, unless ``ignore_eos``, the model's EOS ids stop a sample;
  ``seed`` seeds its sampler (the engine's own stream per request, where MLX's seeds the
  process).

Every refusal is a ``ValueError`` naming the field (INVALID_ARGUMENT, ``worker/refusals.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from tandem.engine.logprobs import MAX_TOP_LOGPROBS
from tandem.engine.sampling import SamplingConfig
from tandem.models.info import ModelInfo
from tandem.wire.mlx import mpb

TEXT_INPUT = "this MLX servicer requires tokenized input (GenerateRequest.tokenized)"


def prompt_ids(request: mpb.GenerateRequest) -> list[int]:
    kind = request.WhichOneof("input")
    if kind != "tokenized":
        got = "text" if kind == "text" else "no input"
        raise ValueError(f"{TEXT_INPUT}; got {got}: tokenize the prompt in the gateway")
    ids = list(request.tokenized.input_ids)
    if not ids:
        raise ValueError("tokenized.input_ids is empty")
    return ids


def refuse_media_tokens(ids: Sequence[int], model: ModelInfo) -> None:
    """A prompt with image or video placeholders is refused, never computed as text."""
    placeholders = {model.image_token_id, model.anchor_token_id}
    if model.video_token_id is not None:
        placeholders.add(model.video_token_id)
    count = sum(1 for token in ids if token in placeholders)
    if count:
        raise ValueError(
            f"the prompt holds {count} image or video placeholder token(s) "
            f"(ids {sorted(placeholders)}), but the mlx worker protocol carries no media: "
            "send text only"
        )


def _finite(name: str, value: float) -> float:
    if not math.isfinite(value):
        raise ValueError(f"sampling_params.{name} must be a finite number, got {value}")
    return float(value)


def _fraction(name: str, value: float, off: float) -> float:
    """A number in [0, 1] where 0 means ``off``."""
    value = _finite(name, value)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"sampling_params.{name} must be in [0, 1] (0: off), got {value}")
    return off if value == 0.0 else value


def logprobs_of(params: mpb.SamplingParams) -> int | None:
    """Alternatives per token (None: no logprobs)."""
    if not params.HasField("logprobs") or params.logprobs == 0:
        return None
    top = int(params.logprobs)
    if not 0 < top <= MAX_TOP_LOGPROBS:
        raise ValueError(
            f"sampling_params.logprobs must be in 0..{MAX_TOP_LOGPROBS} (alternatives per "
            f"token; 0: none), got {top}"
        )
    return top


def _logit_bias(params: mpb.SamplingParams, vocab_size: int) -> tuple[tuple[int, float], ...]:
    bad = sorted(t for t in params.logit_bias if not 0 <= t < vocab_size)
    if bad:
        raise ValueError(
            f"sampling_params.logit_bias names token ids {bad[:5]} outside the vocabulary "
            f"of {vocab_size}"
        )
    return tuple(sorted((t, _finite("logit_bias", b)) for t, b in params.logit_bias.items()))


def sampling_config(
    request: mpb.GenerateRequest, prompt_len: int, max_context: int, vocab_size: int
) -> SamplingConfig:
    """The request's sampling as the engine takes it."""
    params = request.sampling_params
    room = max_context - prompt_len
    if room < 1:
        raise ValueError(
            f"prompt of {prompt_len} tokens leaves no room in the context of {max_context}"
        )
    max_tokens = params.max_tokens if params.HasField("max_tokens") else room
    if max_tokens < 1:
        raise ValueError("sampling_params.max_tokens must be at least 1")
    temperature = params.temperature if params.HasField("temperature") else 1.0
    if not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"sampling_params.temperature must be >= 0, got {temperature}")
    repetition = _finite("repetition_penalty", params.repetition_penalty)
    if repetition < 0:
        raise ValueError(
            f"sampling_params.repetition_penalty must be > 0 (0: none), got {repetition}"
        )
    bad_stops = [t for t in params.stop_token_ids if t >= vocab_size]
    if bad_stops:
        raise ValueError(
            f"sampling_params.stop_token_ids {bad_stops[:5]} are outside the vocabulary "
            f"of {vocab_size}"
        )
    return SamplingConfig(
        max_tokens=min(max_tokens, room),
        temperature=float(temperature),
        top_p=_fraction("top_p", params.top_p, 1.0),
        top_k=int(params.top_k),
        min_p=_fraction("min_p", params.min_p, 0.0),
        stop_token_ids=tuple(params.stop_token_ids),
        ignore_eos=params.ignore_eos,
        seed=params.seed if params.HasField("seed") else None,
        repetition_penalty=repetition or 1.0,
        frequency_penalty=_finite("frequency_penalty", params.frequency_penalty),
        presence_penalty=_finite("presence_penalty", params.presence_penalty),
        logit_bias=_logit_bias(params, vocab_size),
        logprobs=logprobs_of(params),
    )


def stop_ids(request: mpb.GenerateRequest, model: ModelInfo) -> frozenset[int]:
    """What ends a sample with "stop": ``matched_stop_token_id`` names the one that did."""
    ids = set(request.sampling_params.stop_token_ids)
    if not request.sampling_params.ignore_eos:
        ids.update(model.eos_token_ids)
    return frozenset(ids)
