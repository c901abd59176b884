"""The engine's logprob entries as TensorRT-LLM's ``TokenLogprob`` messages.

One message per token: its id, its logprob and, when alternatives were asked for
(``output_config.logprobs`` > 0), that many ``TopLogprob`` entries, highest first (ties to
the lower id, as the engine orders them); with 0, the sampled token's alone.
"""

from __future__ import annotations

from collections.abc import Sequence

from tandem.engine.logprobs import TokenLogprob
from tandem.wire.trtllm import trpb


def wire_logprobs(entries: Sequence[TokenLogprob]) -> list[trpb.TokenLogprob]:
    return [
        trpb.TokenLogprob(
            token_id=entry.token_id,
            logprob=entry.logprob,
            top_logprobs=[
                trpb.TopLogprob(token_id=token, logprob=value)
                for token, value in zip(entry.top_ids, entry.top_values, strict=True)
            ],
        )
        for entry in entries
    ]
