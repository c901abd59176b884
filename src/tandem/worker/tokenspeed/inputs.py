"""From a TokenSpeed ``GenerateRequest`` to the engine's prompt, sampling and constraint.

TokenSpeed's sampling scalars (temperature through ``max_new_tokens``) are ``optional``, so
"unset" and an explicit 0 differ: unset reads as TokenSpeed's own default (temperature 1.0,
top-p 1.0, top-k off, min-p 0, no penalties, repetition penalty 1.0, ``max_new_tokens``
filling the context) and a sent value is taken as sent (temperature 0 is greedy, top-k
<= 0 is off). ``min_new_tokens`` is a plain number, 0 meaning no minimum.
``sampling_seed`` seeds the sampler (each further sample of n > 1 adds its index).

Every refusal is a ``ValueError`` a person can act on (INVALID_ARGUMENT); a field the
worker cannot honour is a ``RefusedField`` naming it (the ``unsupported_parameter`` code in
the trailing metadata, ``worker/refusals.py``). Fields with nothing to do here are ignored:
``skip_special_tokens`` and ``spaces_between_special_tokens`` (the worker returns token ids
and never detokenizes), ``no_stop_trim`` (the ids always end with the stop token that
ended a sample, and ``matched_token_id`` names it, as Tandem's other adapters answer: a
gateway trims it or not from there) and ``original_text`` (cosmetic).
"""

from __future__ import annotations

import math

from tandem.engine.refusals import RefusedField
from tandem.engine.sampling import SamplingConfig
from tandem.wire.tokenspeed import tpb
from tandem.worker.scheduler_inputs import (
    CONSTRAINT_KINDS,
    logit_bias,
    logprobs_of,
    prefill_sampling,
    prompt_ids,
    sampling_n,
    wire_constraint,
)

# TokenSpeed's defaults for the optional floats a request leaves unset.
FLOAT_DEFAULTS: dict[str, float] = {
    "temperature": 1.0,
    "top_p": 1.0,
    "min_p": 0.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
}


def refuse_unsupported(request: tpb.GenerateRequest) -> None:
    """Request fields this worker cannot honour, refused by name."""
    params = request.sampling_params
    if params.stop:
        raise RefusedField(
            "sampling_params.stop: this worker does not detokenize and cannot match stop "
            "strings; the gateway applies them (send single-token stops as stop_token_ids)"
        )
    if params.HasField("custom_params") and params.custom_params.fields:
        raise RefusedField("sampling_params.custom_params is not supported by this worker")
    if (
        request.return_logprob
        and request.HasField("logprob_start_len")
        and request.logprob_start_len >= 0
    ):
        raise RefusedField(
            "prompt logprobs (logprob_start_len >= 0 with return_logprob) are not supported "
            "by this worker; send logprob_start_len = -1 or leave it unset"
        )
    if request.token_ids_logprob:
        raise RefusedField("token_ids_logprob is not supported by this worker")
    if request.HasField("data_parallel_rank") and request.data_parallel_rank != 0:
        raise ValueError(
            f"data_parallel_rank {request.data_parallel_rank}: this worker has one "
            "data-parallel rank, 0"
        )


def _float(params: tpb.SamplingParams, name: str) -> float:
    """A sent value as sent, an unset one as TokenSpeed's default."""
    value = float(getattr(params, name)) if params.HasField(name) else FLOAT_DEFAULTS[name]
    if not math.isfinite(value):
        raise ValueError(f"sampling_params.{name} must be a finite number")
    return value


def sampling_config(
    request: tpb.GenerateRequest, prompt_len: int, max_context: int, vocab_size: int
) -> SamplingConfig:
    """The client's sampling as the engine takes it."""
    params = request.sampling_params
    room = max_context - prompt_len
    if room < 1:
        raise ValueError(
            f"prompt of {prompt_len} tokens leaves no room in the context of {max_context}"
        )
    max_tokens = params.max_new_tokens if params.HasField("max_new_tokens") else room
    if max_tokens < 1:
        raise ValueError("max_new_tokens must be at least 1")
    bad = [t for t in params.stop_token_ids if t >= vocab_size]
    if bad:
        raise ValueError(f"stop_token_ids {bad} are outside the vocabulary of {vocab_size}")
    top_k = params.top_k if params.HasField("top_k") else -1
    return SamplingConfig(
        max_tokens=min(max_tokens, room),
        temperature=_float(params, "temperature"),
        top_p=_float(params, "top_p"),
        top_k=top_k if top_k > 0 else 0,
        min_p=_float(params, "min_p"),
        min_tokens=min(params.min_new_tokens, max_tokens, room),
        stop_token_ids=tuple(params.stop_token_ids),
        ignore_eos=params.ignore_eos,
        seed=params.sampling_seed if params.HasField("sampling_seed") else None,
        repetition_penalty=_float(params, "repetition_penalty"),
        frequency_penalty=_float(params, "frequency_penalty"),
        presence_penalty=_float(params, "presence_penalty"),
        logit_bias=logit_bias(params, vocab_size),
        logprobs=logprobs_of(request),
    )


__all__ = [
    "CONSTRAINT_KINDS",
    "logit_bias",
    "logprobs_of",
    "prefill_sampling",
    "prompt_ids",
    "refuse_unsupported",
    "sampling_config",
    "sampling_n",
    "wire_constraint",
]
