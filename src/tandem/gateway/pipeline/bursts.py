"""Frames that arrived together, folded before they are answered.

A worker that outpaces the gateway (or a client's socket) leaves several frames queued;
the stream then answers them in one go (``respond.py``): consecutive chunks of one choice
become one frame here, so their tokens pass the detokenizer and the stop matcher once and
leave in one SSE chunk, as vLLM's server sends what accumulated meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable

from tandem.gateway.backends.frames import Frame
from tandem.gateway.logprobs import LogprobEntry

# Frames of one burst folded before any of it is sent: a bound on the work done before
# the first of them reaches the client.
MAX_BURST = 256

Logprobs = Callable[[], list[LogprobEntry]]


def chunk_runs(frames: list[Frame]) -> list[Frame]:
    """``frames`` with each run of consecutive chunks of one choice as one chunk (final
    frames stay as they are); the stop matcher still ends a choice inside a run.

    Each run is found first and built once (its ids joined in one list), not re-folded
    frame by frame: a burst of k chunks costs k steps, not k copies of a growing list."""
    out: list[Frame] = []
    i, n = 0, len(frames)
    while i < n:
        first = frames[i]
        j = i + 1
        if not first.final:
            while j < n and not frames[j].final and frames[j].index == first.index:
                j += 1
        if j - i == 1:
            out.append(first)
        else:
            out.append(_one_chunk(frames[i:j]))
        i = j
    return out


def _one_chunk(run: list[Frame]) -> Frame:
    ids: list[int] = []
    parts: list[Logprobs] = []
    prompt_tokens = cached = 0
    for frame in run:  # one pass: this runs for every burst of a stream
        ids += frame.token_ids
        if frame.logprobs is not None:
            parts.append(frame.logprobs)
        prompt_tokens = frame.prompt_tokens or prompt_tokens
        if frame.cached_tokens > cached:
            cached = frame.cached_tokens
    logprobs = _all(parts) if parts else None
    return Frame(run[0].index, ids, logprobs, prompt_tokens=prompt_tokens, cached_tokens=cached)


def _all(parts: list[Logprobs]) -> Logprobs:
    return lambda: [entry for part in parts for entry in part()]
