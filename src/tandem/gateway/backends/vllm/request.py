"""Stage: the ``GenerateRequest`` the workers get, before media are attached."""

from __future__ import annotations

from tandem.gateway.backends.sampling_checks import check_logit_bias
from tandem.gateway.context import RequestContext
from tandem.gateway.pipeline.generation_request import Constraint
from tandem.wire.proto import GenerateRequest, pb


def build_wire_request(ctx: RequestContext) -> GenerateRequest:
    """Tokenized input and sampling; stop strings stay in the gateway.

    The gateway applies stop strings itself (with its incremental detokenizer),
    so the worker stream is always used when they are set: the gateway can then
    drop the stream (which aborts the worker) as soon as every choice stopped.
    """
    s = ctx.sampling
    req = GenerateRequest(request_id=ctx.request_id, stream=ctx.worker_streams)
    req.tokenized.original_text = ctx.prompt_text
    req.tokenized.input_ids.extend(ctx.prompt_ids)
    params = req.sampling_params
    if s.temperature is not None:
        params.temperature = s.temperature
    params.top_p = s.top_p
    params.top_k = s.top_k
    params.min_p = s.min_p
    if s.max_tokens is not None:
        params.max_tokens = s.max_tokens
    params.min_tokens = s.min_tokens
    params.stop_token_ids.extend(s.stop_token_ids)
    params.ignore_eos = s.ignore_eos
    params.n = s.n
    if s.seed is not None:
        params.seed = s.seed
    params.repetition_penalty = s.repetition_penalty
    params.frequency_penalty = s.frequency_penalty
    params.presence_penalty = s.presence_penalty
    params.skip_special_tokens = s.skip_special_tokens
    check_logit_bias(ctx)
    for token, bias in s.logit_bias:
        params.logit_bias[token] = bias
    if s.logprobs is not None:
        params.logprobs = s.logprobs
    if s.constraint is not None:
        set_constraint(params, s.constraint)
    ctx.wire = req
    return req


def set_constraint(params: pb.SamplingParams, constraint: Constraint) -> None:
    """The constraint as the wire's ``SamplingParams`` oneof (docs/pd-contract.md §20)."""
    value = constraint.value
    if constraint.kind == "json_object":
        params.json_object = True
    elif constraint.kind == "choice":
        assert isinstance(value, tuple)
        params.choice.choices.extend(value)
    else:
        assert isinstance(value, str)
        setattr(params, constraint.kind, value)
