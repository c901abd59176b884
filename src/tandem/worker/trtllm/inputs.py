"""From a TensorRT-LLM ``GenerateRequest`` to the engine's prompt, constraint, bias and salt.

What this worker cannot honour is refused by name, never ignored: a ``RefusedField``
(INVALID_ARGUMENT with ``unsupported_parameter``, or ``runtime_pd_not_supported`` for a
PD leg, in the trailing metadata; ``worker/refusals.py``). Shapes that are simply wrong
(an empty prompt, a bias vector of the wrong length) are plain ``ValueError``s.

- ``disaggregated_params``: only ``REQUEST_TYPE_CONTEXT_AND_GENERATION`` (a whole request)
  without ``context_phase_params``; ``ctx_request_id`` means nothing then and is not read.
- ``stop`` and ``bad`` strings: this worker never detokenizes, so it cannot match or ban
  strings; the gateway applies stop strings (single-token stops go as ``stop_token_ids``).
- ``bad_token_ids``: the engine's logit bias stops at -100, which steers but does not ban.
- LoRA, prompt tuning, KV retention, lookahead and star attention's ``query_token_ids``.
- ``output_config``: prompt logprobs, logits and encoder outputs, and an echoed prompt
  (``exclude_input_from_output`` false). A request without ``output_config`` reads as
  TensorRT-LLM's own defaults, which exclude the prompt.

Read as sent: ``guided_decoding`` (JSON → any JSON object, as OpenAI's ``json_object``),
``embedding_bias`` (a dense vector over the vocabulary: its non-zero entries become the
engine's logit bias), ``cache_salt_id`` (salts the prefix cache, in decimal), and
``output_config.logprobs`` (alternatives per token, 0 the sampled token's alone).
``original_text`` and ``arrival_time`` are informative only (the latter feeds
``perf_metrics``).
"""

from __future__ import annotations

import numpy as np

from tandem.engine.logprobs import MAX_TOP_LOGPROBS
from tandem.engine.refusals import RefusedField
from tandem.engine.structured_spec import Constraint, ConstraintKind, StructuredOutputError
from tandem.wire.trtllm import trpb

_PD = trpb.DisaggregatedParams
_GUIDE = trpb.GuidedDecodingParams
# The guide types that name an engine constraint kind (GUIDE_TYPE_JSON has no guide text).
GUIDE_KINDS: dict[int, ConstraintKind] = {
    _GUIDE.GUIDE_TYPE_JSON_SCHEMA: "json_schema",
    _GUIDE.GUIDE_TYPE_REGEX: "regex",
    _GUIDE.GUIDE_TYPE_EBNF_GRAMMAR: "grammar",
    _GUIDE.GUIDE_TYPE_STRUCTURAL_TAG: "structural_tag",
}
# The engine's logit bias range (engine/sampling.py): OpenAI's.
MAX_BIAS = 100.0
# Optional request messages this worker has nothing to do with.
UNSUPPORTED_MESSAGES = {
    "lora_config": "LoRA adapters",
    "prompt_tuning_config": "prompt tuning",
    "kv_cache_retention": "KV cache retention policies",
    "lookahead_config": "lookahead decoding",
}
PD_REASON = (
    "this worker serves whole requests only: Tandem does no PD over the TensorRT-LLM "
    "protocol, whose answers return no context-phase parameters"
)


def _enum_name(enum: object, value: int) -> str:
    try:
        return str(enum.Name(value))  # type: ignore[attr-defined]
    except ValueError:
        return str(value)


def refuse_unsupported(request: trpb.GenerateRequest) -> None:
    """Request fields this worker cannot honour, refused by name."""
    _refuse_pd(request)
    for name, what in UNSUPPORTED_MESSAGES.items():
        if request.HasField(name):
            raise RefusedField(f"{name}: {what} are not supported by this worker")
    if request.stop:
        raise RefusedField(
            "stop: this worker does not detokenize and cannot match stop strings; the "
            "gateway applies them (send single-token stops as stop_token_ids)"
        )
    if request.bad:
        raise RefusedField(
            "bad: this worker does not tokenize bad-word strings; none can be banned here"
        )
    if request.bad_token_ids:
        raise RefusedField(
            "bad_token_ids: this worker's logit bias stops at -100 and cannot ban a token "
            "outright; send the bias you mean in embedding_bias instead"
        )
    if request.tokenized.query_token_ids:
        raise RefusedField(
            "tokenized.query_token_ids: star attention is not supported by this worker; "
            "leave it empty"
        )
    _refuse_outputs(request)


def _refuse_pd(request: trpb.GenerateRequest) -> None:
    if not request.HasField("disaggregated_params"):
        return
    params = request.disaggregated_params
    if params.request_type != _PD.REQUEST_TYPE_CONTEXT_AND_GENERATION:
        name = _enum_name(_PD.RequestType, params.request_type)
        raise RefusedField(
            f"disaggregated_params.request_type {name}: {PD_REASON}", "runtime_pd_not_supported"
        )
    if params.HasField("context_phase_params"):
        raise RefusedField(
            f"disaggregated_params.context_phase_params: {PD_REASON}", "runtime_pd_not_supported"
        )


def _refuse_outputs(request: trpb.GenerateRequest) -> None:
    if not request.HasField("output_config"):
        return  # TensorRT-LLM's defaults: no extras, the prompt excluded
    out = request.output_config
    if out.HasField("prompt_logprobs"):
        raise RefusedField(
            "output_config.prompt_logprobs: prompt logprobs are not supported by this worker"
        )
    for name in ("return_context_logits", "return_generation_logits", "return_encoder_output"):
        if getattr(out, name):
            raise RefusedField(
                f"output_config.{name}: this worker returns no logits or encoder tensors"
            )
    if not out.exclude_input_from_output:
        raise RefusedField(
            "output_config.exclude_input_from_output is false: this worker never echoes the "
            "prompt in output_token_ids; set it true"
        )


def prompt_ids(request: trpb.GenerateRequest, vocab_size: int) -> list[int]:
    if not request.HasField("tokenized"):
        raise ValueError("tokenized input must be provided (GenerateRequest.tokenized)")
    ids = list(request.tokenized.input_token_ids)
    if not ids:
        raise ValueError("tokenized.input_token_ids is empty")
    outside = sorted({t for t in ids if t >= vocab_size})
    if outside:
        raise ValueError(
            f"tokenized.input_token_ids holds {outside[:5]}, outside the vocabulary of {vocab_size}"
        )
    return ids


def logprobs_of(request: trpb.GenerateRequest) -> int | None:
    """Alternatives per generated token when ``output_config.logprobs`` is set (0: the
    sampled token's logprob only); None: no logprobs."""
    out = request.output_config
    if not out.HasField("logprobs"):
        return None
    top = int(out.logprobs)
    if not 0 <= top <= MAX_TOP_LOGPROBS:
        raise ValueError(f"output_config.logprobs must be in 0..{MAX_TOP_LOGPROBS}, got {top}")
    return top


def wire_constraint(request: trpb.GenerateRequest) -> Constraint | None:
    """``guided_decoding`` as the engine's constraint; None when unset."""
    if not request.HasField("guided_decoding"):
        return None
    guided = request.guided_decoding
    if guided.guide_type == _GUIDE.GUIDE_TYPE_JSON:
        if guided.guide:
            raise StructuredOutputError(
                "guided_decoding.guide must be empty with GUIDE_TYPE_JSON (any JSON object); "
                "send a schema as GUIDE_TYPE_JSON_SCHEMA"
            )
        return Constraint("json_object")
    kind = GUIDE_KINDS.get(guided.guide_type)
    if kind is None:
        name = _enum_name(_GUIDE.GuideType, guided.guide_type)
        raise StructuredOutputError(
            f"guided_decoding.guide_type {name}: give GUIDE_TYPE_JSON, GUIDE_TYPE_JSON_SCHEMA, "
            "GUIDE_TYPE_REGEX, GUIDE_TYPE_EBNF_GRAMMAR or GUIDE_TYPE_STRUCTURAL_TAG"
        )
    return Constraint(kind, guided.guide)


def embedding_bias(request: trpb.GenerateRequest, vocab_size: int) -> tuple[tuple[int, float], ...]:
    """The dense ``embedding_bias`` as the engine's sparse logit bias (its non-zero entries)."""
    values = request.embedding_bias
    if not values:
        return ()
    if len(values) != vocab_size:
        raise ValueError(
            f"embedding_bias has {len(values)} values; it is one per token of the "
            f"vocabulary, {vocab_size}"
        )
    bias = np.asarray(values, dtype=np.float32)
    wrong = np.flatnonzero(~np.isfinite(bias) | (np.abs(bias) > MAX_BIAS))
    if wrong.size:
        k = int(wrong[0])
        raise ValueError(
            f"embedding_bias[{k}] is {float(bias[k])}: each bias must be finite and within "
            f"-{MAX_BIAS:g}..{MAX_BIAS:g}"
        )
    return tuple((int(k), float(bias[k])) for k in np.flatnonzero(bias))


def cache_salt(request: trpb.GenerateRequest) -> str | None:
    """``cache_salt_id`` in decimal: requests with different salts share no prefix KV."""
    return str(request.cache_salt_id) if request.HasField("cache_salt_id") else None
