"""Logprobs of sampled tokens: what vLLM calls "raw logprobs", by default.

They are ``log_softmax`` (float32) of the model's logits after the structured-output mask
(disallowed tokens are -inf) and before logit_bias, penalties, min_tokens, temperature and
top-k/p: the model's own distribution over what the constraint allows. So for greedy
decoding without bias or penalties the sampled token is the top alternative, with the same
value. Computed only for requests that ask for them (``SamplingConfig.logprobs``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MAX_TOP_LOGPROBS = 20  # the most alternatives a request may ask for per token


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One generated token's logprob and the ``k`` most likely tokens at its position.

    ``top_ids``/``top_values`` are highest first, ties to the lower id; empty when the
    request asked for the sampled token's logprob only (``logprobs=0``).
    """

    token_id: int
    logprob: float
    top_ids: tuple[int, ...] = ()
    top_values: tuple[float, ...] = ()


def raw_logprobs(scores: torch.Tensor) -> torch.Tensor:
    """``log_softmax`` over the vocabulary of a 1-D score vector, in float32."""
    return torch.log_softmax(scores.to(torch.float32), dim=0)


def token_logprob(logprobs: torch.Tensor, token: int, k: int) -> TokenLogprob:
    """The entry of ``token`` with the ``k`` best alternatives from ``logprobs`` ([vocab])."""
    if k <= 0:
        return TokenLogprob(token, float(logprobs[token]))
    k = min(k, logprobs.numel())
    # torch.topk does not promise which of equal values it returns: take every token at
    # least as likely as the k-th one (ids ascending), then a stable sort puts ties in id
    # order. Under a constraint many tokens are -inf; then all of them are candidates.
    kth = torch.topk(logprobs, k).values[-1]
    candidates = torch.nonzero(logprobs >= kth).flatten()
    order = torch.sort(logprobs[candidates], descending=True, stable=True).indices[:k]
    top = candidates[order]
    return TokenLogprob(
        token,
        float(logprobs[token]),
        tuple(int(t) for t in top),
        tuple(float(v) for v in logprobs[top]),
    )
