"""Stage: the SGLang ``GenerateRequest`` the workers get, before media are attached.

SGLang's sampling fields are plain proto3 numbers (0 means 0), so every one is written
out: an unset temperature is 1.0, top-k off is -1, as SGLang reads them. Stop strings stay
in the gateway (it detokenizes and drops the stream once every choice stopped), so
``stop`` is always empty. What the protocol cannot carry is refused by name before any
media work or leg (docs/worker-protocols.md): a seed (SGLang has no field for one) and
video (SGLang's multimodal inputs here are images).
"""

from __future__ import annotations

from tandem.errors import make_error
from tandem.gateway.backends.sampling_checks import check_logit_bias
from tandem.gateway.backends.scheduler.constraints import ANY_OBJECT_SCHEMA, constraint_field
from tandem.gateway.context import RequestContext
from tandem.gateway.pipeline.generation_request import Constraint
from tandem.wire.sglang import spb

PROTOCOL = "sglang"
__all__ = ["ANY_OBJECT_SCHEMA", "build_wire_request", "set_constraint"]


def build_wire_request(ctx: RequestContext) -> spb.GenerateRequest:
    s = ctx.sampling
    if s.seed is not None:
        raise make_error(
            "unsupported_parameter",
            "seed cannot be honoured: the sglang worker protocol carries no seed "
            "(docs/worker-protocols.md)",
            param="seed",
        )
    if "video" in ctx.media_kinds:
        raise make_error(
            "multimodal_not_supported",
            "video input is not supported over the sglang worker protocol (images only)",
        )
    check_logit_bias(ctx)
    req = spb.GenerateRequest(request_id=ctx.request_id, stream=ctx.worker_streams)
    req.tokenized.original_text = ctx.prompt_text
    req.tokenized.input_ids.extend(ctx.prompt_ids)
    params = req.sampling_params
    params.temperature = 1.0 if s.temperature is None else s.temperature
    params.top_p = s.top_p
    params.top_k = s.top_k if s.top_k > 0 else -1
    params.min_p = s.min_p
    params.frequency_penalty = s.frequency_penalty
    params.presence_penalty = s.presence_penalty
    params.repetition_penalty = s.repetition_penalty
    if s.max_tokens is not None:
        params.max_new_tokens = s.max_tokens
    params.min_new_tokens = s.min_tokens
    params.stop_token_ids.extend(s.stop_token_ids)
    params.ignore_eos = s.ignore_eos
    params.n = s.n
    params.skip_special_tokens = s.skip_special_tokens
    params.spaces_between_special_tokens = True
    for token, bias in s.logit_bias:
        params.logit_bias[str(token)] = bias
    if s.logprobs is not None:
        req.return_logprob = True
        req.top_logprobs_num = s.logprobs
    req.logprob_start_len = -1  # no prompt logprobs
    if s.constraint is not None:
        set_constraint(params, s.constraint)
    ctx.wire = req
    return req


def set_constraint(params: spb.SamplingParams, constraint: Constraint) -> None:
    """The constraint in SGLang's oneof (``backends/scheduler/constraints.py``)."""
    field, value = constraint_field(constraint.kind, constraint.value)
    setattr(params, field, value)
