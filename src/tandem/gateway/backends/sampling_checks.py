"""Checks of the resolved sampling that every protocol's request builder makes alike."""

from __future__ import annotations

from tandem.errors import make_error
from tandem.gateway.context import RequestContext


def check_logit_bias(ctx: RequestContext) -> None:
    """400 ``invalid_request`` for ``logit_bias`` ids outside the model's vocabulary."""
    vocab = ctx.model.info.vocab_size
    outside = [token for token, _ in ctx.sampling.logit_bias if vocab and token >= vocab]
    if outside:
        raise make_error(
            "invalid_request",
            f"logit_bias names token ids {outside[:5]} outside the vocabulary of {vocab}",
            param="logit_bias",
        )
