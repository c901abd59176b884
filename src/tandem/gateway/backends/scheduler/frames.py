"""Frames of the scheduler-shaped protocols (SGLang, TokenSpeed) read into :class:`Frame`.

Both protocols answer ``Generate`` with the same shape under the same field names: a
``GenerateResponse`` holding a ``chunk`` (delta ``token_ids``, cumulative counts, the
chunk's ``output_logprobs``, the choice ``index``) or a ``complete`` (``output_ids``,
``finish_reason``, the counts, ``output_logprobs``). The message classes differ, so this
reads them by name and imports neither protocol. A response with neither a chunk nor a
completion carries nothing and is skipped (None). A final frame repeats the last chunk's
tokens when the worker streamed; the collector reads chunks then (``backends/frames.py``).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from tandem.gateway.backends.frames import Frame
from tandem.gateway.backends.wire_logprobs import entries_from_wire


def scheduler_frame(message: Any) -> Frame | None:
    """One wire frame as a neutral one; logprobs stay unread until asked for."""
    kind = message.WhichOneof("response")
    if kind == "chunk":
        chunk = message.chunk
        logprobs = None
        if chunk.HasField("output_logprobs"):
            logprobs = partial(entries_from_wire, chunk.output_logprobs)
        return Frame(chunk.index, chunk.token_ids, logprobs)
    if kind != "complete":
        return None
    done = message.complete
    logprobs = None
    if done.HasField("output_logprobs"):
        logprobs = partial(entries_from_wire, done.output_logprobs)
    return Frame(
        done.index,
        done.output_ids,
        logprobs,
        final=True,
        finish_reason=done.finish_reason or "stop",
        prompt_tokens=done.prompt_tokens,
        cached_tokens=done.cached_tokens,
    )
