"""The engine's logprob entries as SGLang's ``OutputLogProbs``.

One ``token_logprobs``/``token_ids`` pair per token; one ``TopLogProbs`` per token only
when the request asked for alternatives (``top_logprobs_num`` > 0), exactly that many,
highest first. No entries: no message at all.
"""

from __future__ import annotations

from collections.abc import Sequence

from tandem.engine.logprobs import TokenLogprob
from tandem.wire.sglang import spb


def output_logprobs(entries: Sequence[TokenLogprob], top: int) -> spb.OutputLogProbs | None:
    if not entries:
        return None
    message = spb.OutputLogProbs(
        token_logprobs=[e.logprob for e in entries], token_ids=[e.token_id for e in entries]
    )
    if top > 0:
        for entry in entries:
            message.top_logprobs.add(values=entry.top_values, token_ids=entry.top_ids)
    return message
