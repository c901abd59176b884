"""The engine's logprob entries as TokenSpeed's ``OutputLogProbs``.

One ``token_logprobs``/``token_ids`` pair per token of the frame and, unlike SGLang's,
one ``TopLogProbs`` at every position: with ``top_logprobs_num`` alternatives (highest
first) when asked, empty otherwise. No entries: no message at all.
"""

from __future__ import annotations

from collections.abc import Sequence

from tandem.engine.logprobs import TokenLogprob
from tandem.wire.tokenspeed import tpb


def output_logprobs(entries: Sequence[TokenLogprob]) -> tpb.OutputLogProbs | None:
    if not entries:
        return None
    message = tpb.OutputLogProbs(
        token_logprobs=[e.logprob for e in entries], token_ids=[e.token_id for e in entries]
    )
    for entry in entries:
        message.top_logprobs.add(values=entry.top_values, token_ids=entry.top_ids)
    return message
