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
    frames stay as they are); the stop matcher still ends a choice inside a run."""
    out: list[Frame] = []
    for frame in frames:
        last = out[-1] if out else None
        if last is None or last.final or frame.final or last.index != frame.index:
            out.append(frame)
            continue
        out[-1] = Frame(
            last.index,
            [*last.token_ids, *frame.token_ids],
            _both(last.logprobs, frame.logprobs),
            prompt_tokens=frame.prompt_tokens or last.prompt_tokens,
            cached_tokens=max(last.cached_tokens, frame.cached_tokens),
        )
    return out


def _both(first: Logprobs | None, then: Logprobs | None) -> Logprobs | None:
    if first is None and then is None:
        return None
    return lambda: (first() if first else []) + (then() if then else [])
