"""The request readings the scheduler adapters (SGLang, TokenSpeed) share.

Both protocols name these fields alike — ``tokenized.input_ids``, ``sampling_params.n``,
``return_logprob`` with ``top_logprobs_num``, ``logit_bias`` keyed by the token id in
decimal, the ``constraint`` oneof (``regex``, ``json_schema``, ``ebnf_grammar``,
``structural_tag``) — in different message classes, so these read them by name; each
adapter's ``inputs.py`` keeps what differs (its sampling scalars, its refusals).
"""

from __future__ import annotations

from typing import Any

from tandem.ascii_int import ascii_int
from tandem.engine.logprobs import MAX_TOP_LOGPROBS
from tandem.engine.sampling import SamplingConfig
from tandem.engine.structured_spec import Constraint, ConstraintKind

# The constraint oneof → the engine's kinds (the protocols' EBNF is the engine's "grammar").
CONSTRAINT_KINDS: dict[str, ConstraintKind] = {
    "regex": "regex",
    "json_schema": "json_schema",
    "ebnf_grammar": "grammar",
    "structural_tag": "structural_tag",
}


def prompt_ids(request: Any) -> list[int]:
    if not request.HasField("tokenized"):
        raise ValueError("tokenized input must be provided (GenerateRequest.tokenized)")
    ids = list(request.tokenized.input_ids)
    if not ids:
        raise ValueError("tokenized.input_ids is empty")
    return ids


def sampling_n(request: Any) -> int:
    """Samples asked for; 0 reads as 1."""
    return max(1, int(request.sampling_params.n))


def logprobs_of(request: Any) -> int | None:
    """Alternatives per token when ``return_logprob`` (0: the sampled token's only)."""
    if not request.return_logprob:
        return None
    top = int(request.top_logprobs_num)
    if not 0 <= top <= MAX_TOP_LOGPROBS:
        raise ValueError(f"top_logprobs_num must be in 0..{MAX_TOP_LOGPROBS}, got {top}")
    return top


def logit_bias(params: Any, vocab_size: int) -> tuple[tuple[int, float], ...]:
    """``logit_bias`` keys are token ids written in decimal."""
    bias = []
    for key, value in params.logit_bias.items():
        token = ascii_int(key)
        if token is None or token >= vocab_size:
            raise ValueError(
                f"logit_bias key {key!r} is not a token id of the vocabulary of {vocab_size}"
            )
        bias.append((token, float(value)))
    return tuple(sorted(bias))


def prefill_sampling() -> SamplingConfig:
    """A prefill leg's: one greedy token that nothing stops early. The gateway throws the
    token away, so the prefill runs neither the client's length, its constraint nor its
    logprobs (docs/pd-contract.md §20)."""
    return SamplingConfig(max_tokens=1, temperature=0.0, ignore_eos=True)


def wire_constraint(params: Any) -> Constraint | None:
    """The ``constraint`` oneof as the engine takes it; None when unset."""
    kind = params.WhichOneof("constraint")
    if kind is None:
        return None
    return Constraint(CONSTRAINT_KINDS[kind], getattr(params, kind))
