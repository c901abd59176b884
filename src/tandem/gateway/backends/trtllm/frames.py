"""TensorRT-LLM's ``GenerateResponse`` frames read into the gateway's :class:`Frame`.

A response holds a ``chunk`` (the new ``token_ids`` of one sequence, its
``sequence_index``, cumulative counts, the chunk's ``logprobs``) or a ``complete`` (one per
sequence: every ``output_token_ids``, the finish reason, the counts, ``logprobs`` and
``prompt_logprobs``). ``sequence_index`` is the choice index, so a request with
``num_return_sequences = n`` ends after n completes (``LegStream`` counts them). When the
worker streamed, a complete's ids repeat the chunks and the collector reads chunks only
(``backends/frames.py``). A response with neither part carries nothing (None).

The finish reason is normalized for the client: TensorRT-LLM's ``"stop_word"`` (a stop
string or token matched) is ``"stop"`` to OpenAI, which knows no other word for it; an
empty one is ``"stop"`` too. smg passes ``"stop_word"`` through.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial

from tandem.gateway.backends.frames import Frame
from tandem.gateway.logprobs import LogprobEntry
from tandem.wire.trtllm import trpb

FINISH_REASONS = {"stop_word": "stop", "": "stop"}


def trtllm_frame(message: trpb.GenerateResponse) -> Frame | None:
    """One wire frame as a neutral one; logprobs stay unread until asked for."""
    kind = message.WhichOneof("response")
    if kind == "chunk":
        chunk = message.chunk
        logprobs = partial(logprob_entries, chunk.logprobs) if len(chunk.logprobs) else None
        return Frame(chunk.sequence_index, chunk.token_ids, logprobs)
    if kind != "complete":
        return None
    done = message.complete
    logprobs = partial(logprob_entries, done.logprobs) if len(done.logprobs) else None
    return Frame(
        done.sequence_index,
        done.output_token_ids,
        logprobs,
        final=True,
        finish_reason=finish_reason(done.finish_reason),
        prompt_tokens=done.prompt_tokens,
        cached_tokens=done.cached_tokens,
    )


def finish_reason(reason: str) -> str:
    """The client's word for a TensorRT-LLM finish reason ("length" and others unchanged)."""
    reason = reason.strip().lower()
    return FINISH_REASONS.get(reason, reason)


def logprob_entries(logprobs: Iterable[trpb.TokenLogprob]) -> list[LogprobEntry]:
    """One frame's ``TokenLogprob``\\ s in token order, each with its alternatives."""
    return [
        LogprobEntry(
            int(entry.token_id),
            float(entry.logprob),
            tuple((int(t.token_id), float(t.logprob)) for t in entry.top_logprobs),
        )
        for entry in logprobs
    ]


def prompt_logprob_entries(
    logprobs: Iterable[trpb.TokenLogprob],
) -> list[LogprobEntry | None]:
    """A complete's ``prompt_logprobs``, one per prompt position; the first position has
    no value (nothing precedes it), whatever the worker wrote there. The gateway asks for
    none today (``request.py``); this is how they read when it does."""
    entries: list[LogprobEntry | None] = list(logprob_entries(logprobs))
    if entries:
        entries[0] = None
    return entries
