"""Engine outputs as MLX's answer frames, in the shapes MLX's servicer sends.

Streamed: one ``chunk`` per token (its id, the counts cumulative, that token's logprobs),
then, when the sample ends, a ``complete`` with empty ``output_ids`` (the chunks carried
them). Not streamed: a single ``complete`` with every id and every token's logprobs. Logprobs
are one ``token_ids``/``token_logprobs`` pair and one ``TopLogProbs`` per token (highest
first). A sample that ended on a stop token (EOS, unless ignored, or one of
``stop_token_ids``) names it in ``matched_stop_token_id``; that token stays in the ids, as
MLX's servicer leaves it. Every ``index`` is 0: a request is one sample.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from tandem.engine.logprobs import TokenLogprob
from tandem.engine.request import EngineOutput
from tandem.wire.mlx import mpb


def output_logprobs(entries: Sequence[TokenLogprob]) -> mpb.OutputLogProbs | None:
    if not entries:
        return None
    message = mpb.OutputLogProbs(
        token_logprobs=[e.logprob for e in entries], token_ids=[e.token_id for e in entries]
    )
    for entry in entries:
        message.top_logprobs.add(values=entry.top_values, token_ids=entry.top_ids)
    return message


def chunks(out: EngineOutput) -> Iterator[mpb.GenerateResponse]:
    """One chunk per token of the output's delta."""
    before = out.completion_tokens - len(out.token_ids)
    for i, token in enumerate(out.token_ids):
        entry = out.logprobs[i : i + 1]
        yield mpb.GenerateResponse(
            chunk=mpb.GenerateStreamChunk(
                token_ids=[token],
                prompt_tokens=out.prompt_tokens,
                completion_tokens=before + i + 1,
                cached_tokens=out.cached_tokens,
                output_logprobs=output_logprobs(entry),
                index=0,
            )
        )


def complete(out: EngineOutput, stream: bool, stop_ids: frozenset[int]) -> mpb.GenerateResponse:
    message = mpb.GenerateComplete(
        output_ids=[] if stream else out.output_ids,
        finish_reason=out.finish_reason or "stop",
        prompt_tokens=out.prompt_tokens,
        completion_tokens=out.completion_tokens,
        cached_tokens=out.cached_tokens,
        output_logprobs=None if stream else output_logprobs(out.output_logprobs),
        index=0,
    )
    last = out.output_ids[-1] if out.output_ids else None
    if out.finish_reason == "stop" and last is not None and last in stop_ids:
        message.matched_stop_token_id = last
    return mpb.GenerateResponse(complete=message)
