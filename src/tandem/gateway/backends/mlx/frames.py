"""MLX's ``GenerateResponse`` frames read into :class:`~tandem.gateway.backends.frames.Frame`.

A response holds a ``chunk`` (delta ``token_ids``, one token each on MLX's servicer, with
cumulative counts and that token's ``output_logprobs``) or a ``complete`` (the finish
reason, the counts and, when the worker did not stream, every ``output_ids`` with their
logprobs; streamed, its ``output_ids`` are empty: the collector reads chunks then). Neither
names its request (MLX's answers carry no request id) and every ``index`` is 0: a request is
one sample, and the fan-out of n > 1 stamps each sample's frames with its own index
(``streams.py``). The logprob messages have SGLang's field names
(``backends/wire_logprobs.py``); their alternatives are trimmed to what the client asked for
(``leg.py``).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from tandem.gateway.backends.frames import Frame
from tandem.gateway.backends.wire_logprobs import entries_from_wire
from tandem.gateway.logprobs import LogprobEntry


def mlx_frame(message: Any, alternatives: int | None = None) -> Frame | None:
    """One wire frame as a neutral one; logprobs stay unread until asked for. None for a
    response with neither a chunk nor a completion (it carries nothing)."""
    kind = message.WhichOneof("response")
    if kind == "chunk":
        chunk = message.chunk
        return Frame(0, chunk.token_ids, _logprobs(chunk, alternatives))
    if kind != "complete":
        return None
    done = message.complete
    return Frame(
        0,
        done.output_ids,
        _logprobs(done, alternatives),
        final=True,
        finish_reason=done.finish_reason or "stop",
        prompt_tokens=done.prompt_tokens,
        cached_tokens=done.cached_tokens,
    )


def _logprobs(part: Any, alternatives: int | None) -> Any:
    if not part.HasField("output_logprobs"):
        return None
    return partial(entries, part.output_logprobs, alternatives)


def entries(logprobs: Any, alternatives: int | None) -> list[LogprobEntry]:
    """The frame's entries with at most ``alternatives`` alternatives each (None: as sent)."""
    read = entries_from_wire(logprobs)
    if alternatives is None or all(len(e.top) <= alternatives for e in read):
        return read
    return [LogprobEntry(e.token_id, e.logprob, e.top[:alternatives]) for e in read]
