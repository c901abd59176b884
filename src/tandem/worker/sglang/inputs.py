"""From an SGLang ``GenerateRequest`` to the engine's prompt, sampling and constraint.

SGLang's sampling fields are plain proto3 numbers: 0 means 0 and gateways write every one
out (temperature 1.0 and top-k -1 when the client left them unset). Two zeros carry no
meaning and read as "off", as the vLLM adapter reads them: ``top_p`` 0 and
``repetition_penalty`` 0. ``top_k`` <= 0 is off. There is no seed in this protocol.

Every refusal is a ``ValueError`` a person can act on (INVALID_ARGUMENT); a field the
worker cannot honour is a ``RefusedField`` naming it (with the ``unsupported_parameter``
code in the trailing metadata, ``worker/refusals.py``). Fields with nothing to do here are
ignored: ``skip_special_tokens``, ``spaces_between_special_tokens`` and ``no_stop_trim``
(the worker returns token ids and never detokenizes), ``stream_interval``,
``data_parallel_rank`` (one rank), ``require_reasoning``, ``log_metrics``, ``timestamp``.
"""

from __future__ import annotations

import math

from tandem.engine.refusals import RefusedField
from tandem.engine.sampling import SamplingConfig
from tandem.wire.sglang import spb
from tandem.worker.scheduler_inputs import (
    CONSTRAINT_KINDS,
    logit_bias,
    logprobs_of,
    prefill_sampling,
    prompt_ids,
    sampling_n,
    wire_constraint,
)

_FLOATS = (
    "temperature",
    "top_p",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
)


def refuse_unsupported(request: spb.GenerateRequest) -> None:
    """Request fields this worker cannot honour, refused by name."""
    params = request.sampling_params
    if params.stop:
        raise RefusedField(
            "sampling_params.stop: this worker does not detokenize and cannot match stop "
            "strings; the gateway applies them (send single-token stops as stop_token_ids)"
        )
    if params.HasField("custom_params") and params.custom_params.fields:
        raise RefusedField("sampling_params.custom_params is not supported by this worker")
    if request.return_logprob and request.logprob_start_len >= 0:
        raise RefusedField(
            "prompt logprobs (logprob_start_len >= 0 with return_logprob) are not supported "
            "by this worker; send logprob_start_len = -1"
        )
    refused = [
        name
        for name, is_set in (
            ("token_ids_logprob", bool(request.token_ids_logprob)),
            ("return_hidden_states", request.return_hidden_states),
            ("input_embeds", bool(request.input_embeds)),
            ("lora_id", bool(request.lora_id)),
            ("custom_logit_processor", bool(request.custom_logit_processor)),
        )
        if is_set
    ]
    if refused:
        raise RefusedField(f"{refused[0]} is not supported by this worker")


def sampling_config(
    request: spb.GenerateRequest, prompt_len: int, max_context: int, vocab_size: int
) -> SamplingConfig:
    """The client's sampling as the engine takes it (``max_new_tokens`` unset: fill the
    context)."""
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
    for name in _FLOATS:
        if not math.isfinite(getattr(params, name)):
            raise ValueError(f"{name} must be a finite number")
    return SamplingConfig(
        max_tokens=min(max_tokens, room),
        temperature=params.temperature,
        top_p=params.top_p or 1.0,
        top_k=params.top_k if params.top_k > 0 else 0,
        min_p=params.min_p,
        min_tokens=min(params.min_new_tokens, max_tokens, room),
        stop_token_ids=tuple(params.stop_token_ids),
        ignore_eos=params.ignore_eos,
        repetition_penalty=params.repetition_penalty or 1.0,
        frequency_penalty=params.frequency_penalty,
        presence_penalty=params.presence_penalty,
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
