"""The engine's logprob entries as the wire's ``OutputLogProbs``, as vLLM's servicer sends them.

One ``token_logprobs``/``token_ids`` pair per token; one ``TopLogProbs`` per token only
when the request asked for alternatives (``logprobs`` > 0), exactly that many, highest
first. With ``logprobs`` = 0 ``top_logprobs`` stays empty. No entries: no message at all.
"""

from __future__ import annotations

from collections.abc import Sequence

from tandem.engine.logprobs import TokenLogprob
from tandem.wire.proto import pb


def output_logprobs(entries: Sequence[TokenLogprob], top: int) -> pb.OutputLogProbs | None:
    if not entries:
        return None
    message = pb.OutputLogProbs(
        token_logprobs=[e.logprob for e in entries], token_ids=[e.token_id for e in entries]
    )
    if top > 0:
        for entry in entries:
            message.top_logprobs.add(values=entry.top_values, token_ids=entry.top_ids)
    return message
