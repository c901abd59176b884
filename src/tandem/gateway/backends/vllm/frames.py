"""vLLM's ``GenerateResponse`` frames read into the gateway's :class:`Frame`."""

from __future__ import annotations

from functools import partial

from tandem.gateway.backends.frames import Frame
from tandem.gateway.backends.wire_logprobs import entries_from_wire
from tandem.wire.kv_params import complete_kv_params_json
from tandem.wire.proto import pb


def frame_of(message: pb.GenerateResponse) -> Frame:
    """One wire frame as a neutral one; logprobs stay unread until asked for."""
    if message.HasField("chunk"):
        chunk = message.chunk
        logprobs = None
        if chunk.HasField("output_logprobs"):
            logprobs = partial(entries_from_wire, chunk.output_logprobs)
        return Frame(chunk.index, chunk.token_ids, logprobs)
    done = message.complete
    logprobs = None
    if done.HasField("output_logprobs"):
        logprobs = partial(entries_from_wire, done.output_logprobs)
    return Frame(
        done.index,
        done.output_ids,
        logprobs,
        final=True,
        finish_reason=done.finish_reason,
        prompt_tokens=done.prompt_tokens,
        cached_tokens=done.cached_tokens,
        kv_params=complete_kv_params_json(done),
        media_identity=done.media_identity if done.HasField("media_identity") else None,
    )
