"""Stage: the TensorRT-LLM ``GenerateRequest`` the workers get, before media are attached.

What each field carries (docs/worker-protocols.md): the rendered prompt and its ids;
``sampling_config`` with one beam and ``num_return_sequences = n`` (the worker returns
every choice from one request), every scalar TensorRT-LLM reads as "unset" written out
with its default (temperature, top-p and repetition penalty 1.0), top-k only when the
client set one, the client's seed (uint64; smg drops it on chat, Tandem sends it);
``output_config`` asking for the sampled token's logprob and ``top_logprobs``
alternatives only when logprobs are wanted, and never the prompt back;
``max_tokens`` (required) as the client's limit, else what the context leaves.

Stop strings stay in the gateway, as for every protocol (it detokenizes and drops the
stream once every choice stopped), so ``stop`` is empty; the client's stop token ids are
forwarded (smg drops them on chat), and the stop token comes back in the output as on the
other protocols. ``logit_bias`` travels as ``embedding_bias``, a dense
vector over the vocabulary. A cache salt travels as ``cache_salt_id``. Refused by name
before any media work or leg: a negative seed, video (this protocol carries images only),
a ``logit_bias`` outside the vocabulary or over a model whose vocabulary is unknown.
"""

from __future__ import annotations

from blake3 import blake3

from tandem.errors import make_error
from tandem.gateway.backends.sampling_checks import check_logit_bias
from tandem.gateway.backends.trtllm.guided import set_guide
from tandem.gateway.context import RequestContext
from tandem.wire.trtllm import trpb

UINT64_LIMIT = 1 << 64
INT32_MAX = (1 << 31) - 1
UINT32_MAX = (1 << 32) - 1
# max_tokens when the client set none and the model's context is unknown (smg's default).
UNKNOWN_CONTEXT_MAX_TOKENS = 2048


def build_wire_request(ctx: RequestContext) -> trpb.GenerateRequest:
    s = ctx.sampling
    if s.seed is not None and not 0 <= s.seed < UINT64_LIMIT:
        raise make_error(
            "invalid_request",
            "sampling seed must be an unsigned integer: the trtllm worker protocol carries "
            f"a uint64 seed, got {s.seed}",
            param="seed",
        )
    if "video" in ctx.media_kinds:
        raise make_error(
            "multimodal_not_supported",
            "video input is not supported over the trtllm worker protocol (its engine takes "
            "images only; docs/worker-protocols.md)",
        )
    check_logit_bias(ctx)
    req = trpb.GenerateRequest(request_id=ctx.request_id, streaming=ctx.worker_streams)
    req.tokenized.original_text = ctx.prompt_text
    req.tokenized.input_token_ids.extend(ctx.prompt_ids)
    _sampling(req.sampling_config, ctx)
    if s.logprobs is not None:
        req.output_config.logprobs = s.logprobs  # 0: the sampled token's own only
    # The engine's default too, written out: the answer holds the new tokens only. Prompt
    # logprobs are never asked for: the endpoints refuse ``prompt_logprobs``
    # (endpoints/common/unhonoured.py), so the neutral sampling carries no such request.
    req.output_config.exclude_input_from_output = True
    req.max_tokens = max_tokens(ctx, len(ctx.prompt_ids))
    req.stop_token_ids.extend(s.stop_token_ids)
    req.ignore_eos = s.ignore_eos
    # The token that ended a choice comes back as the other protocols' workers send it
    # (vLLM's keeps it), so usage and logprobs count it alike; its text is never shown.
    req.include_stop_token_in_output = True
    if s.constraint is not None:
        set_guide(req, s.constraint)
    if s.logit_bias:
        req.embedding_bias.extend(dense_bias(ctx))
    # The neutral sampling carries no cache salt yet (the endpoints refuse ``cache_salt``:
    # no other protocol here can carry it); read by name so it travels once it does.
    salt = getattr(s, "cache_salt", None)
    if salt is not None:
        req.cache_salt_id = cache_salt_id(str(salt))
    ctx.wire = req
    return req


def _sampling(config: trpb.SamplingConfig, ctx: RequestContext) -> None:
    s = ctx.sampling
    config.beam_width = 1
    config.num_return_sequences = s.n
    config.temperature = 1.0 if s.temperature is None else s.temperature
    config.top_p = s.top_p
    if s.top_k > 0:
        # int32 on this wire; any top-k at or above the vocabulary keeps every token, so a
        # larger one means the same as the largest the field holds.
        config.top_k = min(s.top_k, INT32_MAX)
    config.min_p = s.min_p
    config.repetition_penalty = s.repetition_penalty
    config.presence_penalty = s.presence_penalty
    config.frequency_penalty = s.frequency_penalty
    if s.seed is not None:
        config.seed = s.seed
    if s.min_tokens > 0:
        config.min_tokens = s.min_tokens


def max_tokens(ctx: RequestContext, prompt_len: int) -> int:
    """The client's limit; else up to the model's context after a prompt of ``prompt_len``
    (the ids as the worker sees them); else, the context being unknown, 2048.

    The field is required, so "unset" must be written as a number: Tandem's rule for an
    unset limit is "up to the context", as its other protocols' workers read it (smg sends
    2048 whatever the context). A prompt whose expanded images fill the context is a 400.
    """
    wanted = ctx.sampling.max_tokens
    if wanted is not None:
        return min(wanted, UINT32_MAX)
    context = ctx.model.info.max_context
    if not context:
        return UNKNOWN_CONTEXT_MAX_TOKENS
    left = context - prompt_len
    if left < 1:
        raise make_error(
            "invalid_request",
            f"the prompt has {prompt_len} tokens with its images expanded; the model's "
            f"context is {context}",
            param="messages",
        )
    return min(left, UINT32_MAX)


def dense_bias(ctx: RequestContext) -> list[float]:
    """``logit_bias`` as ``embedding_bias``: one float per vocabulary entry, each bias at
    its token id (ids already checked against the vocabulary)."""
    vocab = ctx.model.info.vocab_size
    if vocab <= 0:
        raise make_error(
            "invalid_request",
            "logit_bias cannot be carried: the trtllm worker protocol takes a bias per "
            "vocabulary entry, and this model's vocabulary size is unknown",
            param="logit_bias",
        )
    bias = [0.0] * vocab
    for token, value in ctx.sampling.logit_bias:
        bias[token] = value
    return bias


def cache_salt_id(salt: str) -> int:
    """The signed int64 a cache salt travels as: the first 8 bytes of BLAKE3 of its UTF-8
    text, little-endian. Stable across gateways and restarts, so every gateway salts a
    tenant's prefix cache alike."""
    return int.from_bytes(blake3(salt.encode("utf-8")).digest()[:8], "little", signed=True)
