"""Stage: the MLX ``GenerateRequest`` the workers get (docs/worker-protocols.md).

Always tokenized (MLX's servicer refuses ``text``). ``temperature`` is the one optional
float and is always written: the client's value, else 1.0, so every servicer samples as
vLLM's would (MLX's reads an unset one as 1.0 too; mlx-lm alone would be greedy). The other
scalars are plain numbers, 0 meaning off (``top_k``) or none; ``max_tokens`` only when the
client gave one (the servicer then fills the context). The protocol cannot say ``n``, so a
request for n samples is n requests (``leg.py``); its ``logprobs`` counts alternatives from
1 up, so logprobs without alternatives are sent as 1 and trimmed back in the frames.

Stop strings stay in the gateway, as for every protocol (it detokenizes and drops the
stream once every choice stopped); smg refuses them here instead. Refused by name before
any media work or leg: media (the protocol carries none), any structured-output constraint
(it has no field for one), ``min_tokens`` (nor for that), a seed outside int32 and more
alternatives than the servicer returns.
"""

from __future__ import annotations

from tandem.errors import make_error
from tandem.gateway.backends.mlx.leg import INT32_MIN, MlxLeg
from tandem.gateway.backends.sampling_checks import check_logit_bias
from tandem.gateway.context import RequestContext
from tandem.gateway.pipeline.generation_request import Constraint
from tandem.wire.mlx import MAX_TOP_LOGPROBS, mpb

PROTOCOL = "mlx"
INT32_MAX = -INT32_MIN - 1


def build_wire_request(ctx: RequestContext) -> MlxLeg:
    s = ctx.sampling
    refuse_unsupported(ctx)
    check_logit_bias(ctx)
    req = mpb.GenerateRequest(request_id=ctx.request_id, stream=ctx.worker_streams)
    req.tokenized.original_text = ctx.prompt_text
    req.tokenized.input_ids.extend(ctx.prompt_ids)
    params = req.sampling_params
    params.temperature = 1.0 if s.temperature is None else s.temperature
    params.top_p = s.top_p
    params.top_k = max(s.top_k, 0)
    params.min_p = s.min_p
    params.repetition_penalty = s.repetition_penalty
    params.frequency_penalty = s.frequency_penalty
    params.presence_penalty = s.presence_penalty
    for token, bias in s.logit_bias:
        params.logit_bias[token] = bias
    if s.max_tokens is not None:
        params.max_tokens = s.max_tokens
    params.stop_token_ids.extend(s.stop_token_ids)
    params.ignore_eos = s.ignore_eos
    if s.logprobs is not None:
        params.logprobs = max(1, s.logprobs)
    if s.seed is not None:
        params.seed = s.seed
    leg = MlxLeg(req, max(1, s.n), s.logprobs)
    ctx.wire = leg
    return leg


def refuse_unsupported(ctx: RequestContext) -> None:
    """400s, by name, for what an MLX request cannot carry."""
    s = ctx.sampling
    if ctx.media_kinds:
        kinds = " and ".join(sorted(set(ctx.media_kinds)))
        raise make_error(
            "multimodal_not_supported",
            f"{kinds} input is not supported over the {PROTOCOL} worker protocol (it carries "
            "text only; docs/worker-protocols.md): remove the media parts",
        )
    if s.constraint is not None:
        raise _constraint_refusal(s.constraint)
    if s.min_tokens:
        raise make_error(
            "unsupported_parameter",
            f"min_tokens cannot be honoured: the {PROTOCOL} worker protocol has no field for "
            "it (docs/worker-protocols.md)",
            param="min_tokens",
        )
    if s.seed is not None and not INT32_MIN <= s.seed <= INT32_MAX:
        raise make_error(
            "invalid_request",
            f"seed must fit in a signed 32-bit integer: the {PROTOCOL} worker protocol "
            f"carries an int32 seed, got {s.seed}",
            param="seed",
        )
    if s.logprobs is not None and s.logprobs > MAX_TOP_LOGPROBS:
        param = "logprobs" if ctx.route == "completions" else "top_logprobs"
        raise make_error(
            "invalid_request",
            f"{param}: at most {MAX_TOP_LOGPROBS} alternatives per token come back over the "
            f"{PROTOCOL} worker protocol, {s.logprobs} were asked for",
            param=param,
        )


def _constraint_refusal(constraint: Constraint) -> Exception:
    """The field the constraint came from, named (``Constraint.param``)."""
    param = constraint.param
    if param.startswith("tool_choice"):
        why = "a forced tool choice is decoded under a JSON-schema constraint"
    else:
        why = f"{param} is a structured-output constraint ({constraint.kind})"
    return make_error(
        "unsupported_parameter",
        f"{why}, and the {PROTOCOL} worker protocol carries none (docs/worker-protocols.md): "
        f"remove '{param}' or serve the model over another protocol",
        param=param,
    )
