"""Engine outputs as TokenSpeed's answer frames.

Streamed: one ``chunk`` per engine output with tokens (the new ids, the counts cumulative,
the frame's logprobs) and, when a sample ends, a ``complete`` repeating its last chunk's
ids. Not streamed: one ``complete`` per sample with every id and logprob. A sample that
ended on a stop token (EOS or one of ``stop_token_ids``) names it in ``matched_token_id``.
"""

from __future__ import annotations

from tandem.engine.request import EngineOutput
from tandem.wire.tokenspeed import tpb
from tandem.worker.tokenspeed.logprobs import output_logprobs


def chunk(out: EngineOutput) -> tpb.GenerateStreamChunk:
    return tpb.GenerateStreamChunk(
        token_ids=out.token_ids,
        prompt_tokens=out.prompt_tokens,
        completion_tokens=out.completion_tokens,
        cached_tokens=out.cached_tokens,
        output_logprobs=output_logprobs(out.logprobs),
        index=out.index,
    )


def complete(out: EngineOutput, stream: bool, stop_ids: frozenset[int]) -> tpb.GenerateComplete:
    # Streamed, the chunks carried every id: the complete repeats the last chunk's.
    message = tpb.GenerateComplete(
        output_ids=out.token_ids if stream else out.output_ids,
        finish_reason=out.finish_reason or "stop",
        prompt_tokens=out.prompt_tokens,
        completion_tokens=out.completion_tokens,
        cached_tokens=out.cached_tokens,
        output_logprobs=None if stream else output_logprobs(out.output_logprobs),
        index=out.index,
    )
    last = out.output_ids[-1] if out.output_ids else None
    if out.finish_reason == "stop" and last is not None and last in stop_ids:
        message.matched_token_id = last
    return message
