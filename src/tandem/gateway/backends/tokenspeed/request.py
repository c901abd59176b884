"""Stage: the TokenSpeed ``GenerateRequest`` the workers get, before media are attached.

TokenSpeed's sampling scalars carry presence (``optional``), so each is written as
present, with TokenSpeed's own defaults where the client left it unset (temperature 1.0,
top-k -1 for off), and an explicit 0 stays 0. The seed travels as ``sampling_seed``
(uint64: a negative seed is refused by name). Stop strings stay in the gateway, as for
the other protocols (it detokenizes and drops the stream once every choice stopped), so
``stop`` is empty. What the protocol path cannot carry here is refused by name before any
media work or leg: video (Tandem's TokenSpeed legs carry images).
"""

from __future__ import annotations

from tandem.errors import make_error
from tandem.gateway.backends.sampling_checks import check_logit_bias
from tandem.gateway.backends.scheduler.constraints import constraint_field
from tandem.gateway.context import RequestContext
from tandem.wire.tokenspeed import tpb

PROTOCOL = "tokenspeed"
UINT64_LIMIT = 1 << 64


def build_wire_request(ctx: RequestContext) -> tpb.GenerateRequest:
    s = ctx.sampling
    if s.seed is not None and not 0 <= s.seed < UINT64_LIMIT:
        raise make_error(
            "invalid_request",
            "sampling seed must be an unsigned integer: the tokenspeed worker protocol "
            f"carries a uint64 seed, got {s.seed}",
            param="seed",
        )
    if "video" in ctx.media_kinds:
        raise make_error(
            "multimodal_not_supported",
            "video input is not supported over the tokenspeed worker protocol here "
            "(images only; docs/worker-protocols.md)",
        )
    check_logit_bias(ctx)
    req = tpb.GenerateRequest(request_id=ctx.request_id, stream=ctx.worker_streams)
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
    if s.seed is not None:
        params.sampling_seed = s.seed
    for token, bias in s.logit_bias:
        params.logit_bias[str(token)] = bias
    if s.logprobs is not None:
        req.return_logprob = True
        req.top_logprobs_num = s.logprobs
    req.logprob_start_len = -1  # present and -1: no prompt logprobs
    if s.constraint is not None:
        field, value = constraint_field(s.constraint.kind, s.constraint.value)
        setattr(params, field, value)
    ctx.wire = req
    return req
