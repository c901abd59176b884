"""TensorRT-LLM's ``SamplingConfig`` and ``max_tokens`` as the engine's ``SamplingConfig``.

The scalars are ``optional``, so "unset" and 0 differ. Unset reads as TensorRT-LLM's own
defaults: top-p 1.0, no min-p, no penalties, repetition penalty 1.0, no minimum length,
and a temperature of 1.0 — or greedy decoding when temperature, top-p and top-k are all
unset, as TensorRT-LLM reads a request that names no sampling at all. A sent value is
taken as sent: temperature 0 is greedy, top-k <= 0 is off. ``seed`` (uint64) seeds the
sampler; each further sample of ``num_return_sequences`` adds its index (the engine does).

``max_tokens`` is required: 0, proto3's unset, is refused rather than guessed at. A
limit beyond the context is clamped to what the context leaves, as Tandem's other
adapters clamp it (smg sends 2048 whenever a client gives none), and a prompt that leaves
no room is refused.

Beam search and its knobs, and TensorRT-LLM's top-p decay, are refused by name when set:
this engine samples one sequence at a time and has no such controls.
"""

from __future__ import annotations

from tandem.engine.refusals import RefusedField
from tandem.engine.sampling import SamplingConfig
from tandem.wire.trtllm import trpb

# Fields the engine has no counterpart of; each is refused when present.
UNSUPPORTED_FIELDS = {
    "top_p_min": "top-p decay",
    "top_p_reset_ids": "top-p decay",
    "top_p_decay": "top-p decay",
    "beam_search_diversity_rate": "beam search",
    "length_penalty": "beam search",
    "early_stopping": "beam search",
    "no_repeat_ngram_size": "n-gram blocking",
    "prompt_ignore_length": "penalties that skip part of the prompt",
}
# Unset optional floats read as these.
FLOAT_DEFAULTS: dict[str, float] = {
    "top_p": 1.0,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}


def refuse_unsupported_sampling(config: trpb.SamplingConfig) -> None:
    if config.beam_width not in (0, 1):
        raise RefusedField(
            f"sampling_config.beam_width {config.beam_width}: beam search is not supported by "
            "this worker; send 1 (sampling)"
        )
    if config.beam_width_array:
        raise RefusedField(
            "sampling_config.beam_width_array: beam search is not supported by this worker"
        )
    for name, what in UNSUPPORTED_FIELDS.items():
        if config.HasField(name):
            raise RefusedField(
                f"sampling_config.{name}: {what} is not supported by this worker; leave it unset"
            )


def sampling_n(request: trpb.GenerateRequest) -> int:
    """Sequences asked for (``num_return_sequences``); 0 reads as 1."""
    return max(1, int(request.sampling_config.num_return_sequences))


def _float(config: trpb.SamplingConfig, name: str) -> float:
    return float(getattr(config, name)) if config.HasField(name) else FLOAT_DEFAULTS[name]


def _temperature(config: trpb.SamplingConfig) -> float:
    if config.HasField("temperature"):
        return float(config.temperature)
    named = any(config.HasField(name) for name in ("top_p", "top_k"))
    return 1.0 if named else 0.0  # nothing named: TensorRT-LLM decodes greedily


def sampling_config(
    request: trpb.GenerateRequest,
    prompt_len: int,
    max_context: int,
    vocab_size: int,
    *,
    logit_bias: tuple[tuple[int, float], ...] = (),
    logprobs: int | None = None,
) -> SamplingConfig:
    """The request's sampling as the engine takes it (ValueError naming the field)."""
    config = request.sampling_config
    refuse_unsupported_sampling(config)
    room = max_context - prompt_len
    if room < 1:
        raise ValueError(
            f"prompt of {prompt_len} tokens leaves no room in the context of {max_context}"
        )
    if request.max_tokens < 1:
        raise ValueError("max_tokens is required and must be at least 1")
    max_tokens = min(int(request.max_tokens), room)
    outside = [t for t in request.stop_token_ids if t >= vocab_size]
    if outside:
        raise ValueError(f"stop_token_ids {outside} are outside the vocabulary of {vocab_size}")
    min_tokens = int(config.min_tokens) if config.HasField("min_tokens") else 0
    if min_tokens > request.max_tokens:
        raise ValueError(
            f"sampling_config.min_tokens ({min_tokens}) must not exceed max_tokens "
            f"({request.max_tokens})"
        )
    top_k = int(config.top_k) if config.HasField("top_k") else 0
    try:
        return SamplingConfig(
            max_tokens=max_tokens,
            temperature=_temperature(config),
            top_p=_float(config, "top_p"),
            top_k=max(top_k, 0),
            min_p=_float(config, "min_p"),
            min_tokens=min(min_tokens, max_tokens),  # the context ends it first
            stop_token_ids=tuple(request.stop_token_ids),
            ignore_eos=request.ignore_eos,
            seed=int(config.seed) if config.HasField("seed") else None,
            repetition_penalty=_float(config, "repetition_penalty"),
            frequency_penalty=_float(config, "frequency_penalty"),
            presence_penalty=_float(config, "presence_penalty"),
            logit_bias=logit_bias,
            logprobs=logprobs,
        )
    except ValueError as exc:
        raise ValueError(f"sampling_config: {exc}") from None
