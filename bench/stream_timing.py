"""Token timing of SSE chat streams as a client sees them (docs/benchmarks.md, "mixed load").

The load generator records when each HTTP chunk of a streamed answer arrived; here those
arrivals become the times of the SSE events that carry generated text, and per-stream TPOT
(time per output token after the first) and the gaps between tokens (inter-token latency,
ITL) are summarised over many streams.

Tokens are counted as the characters of each event's ``delta.content``: exact for the
bench's null workers, whose canned ASCII text is one byte-level token a character. A
gateway that sends several tokens in one event (Tandem does for tokens that arrived
together, as vLLM's server does) is then timed per token, as one that writes several
one-token events at once: the tokens of one event share its time.
"""

from __future__ import annotations

import itertools
import json

from bench.loadgen_stats import percentile


def content_times(chunks: list[tuple[float, bytes]]) -> list[float]:
    """Arrival time of every content token, in order (an event's tokens share its time).

    An event split across HTTP chunks counts when its last byte arrived; events that share
    a chunk share its time (a gateway that batches frames into one write shows gaps of 0).
    """
    times: list[float] = []
    pending = b""
    for at, data in chunks:
        pending += data
        *events, pending = pending.replace(b"\r\n", b"\n").split(b"\n\n")
        for event in events:
            times.extend([at] * _content_tokens(event))
    if pending.strip():
        times.extend([chunks[-1][0]] * _content_tokens(pending))
    return times


def _content_tokens(event: bytes) -> int:
    """Characters of the event's ``delta.content`` (see the module's note on tokens)."""
    count = 0
    for line in event.split(b"\n"):
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if not data.startswith(b"{"):
            continue
        try:
            choices = json.loads(data).get("choices") or []
        except ValueError:
            continue
        count += sum(len((c.get("delta") or {}).get("content") or "") for c in choices)
    return count


def stream_figures(start: float, times: list[float]) -> dict[str, float | list[float] | None]:
    """TTFT, TPOT and gaps (seconds) of one stream whose request was written at ``start``."""
    if not times:
        return {"ttft": None, "tpot": None, "gaps": []}
    gaps = [b - a for a, b in itertools.pairwise(times)]
    tpot = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None
    return {"ttft": times[0] - start, "tpot": tpot, "gaps": gaps}


def summarise(streams: list[dict]) -> dict[str, float | int | None]:
    """p50/p99 (ms) of per-stream TPOT, of all gaps (ITL) and of TTFT over ``streams``."""
    tpots = [s["tpot"] for s in streams if s.get("tpot") is not None]
    ttfts = [s["ttft"] for s in streams if s.get("ttft") is not None]
    gaps = [g for s in streams for g in s.get("gaps", [])]
    return {
        "streams": len(streams),
        "tpot_p50_ms": _ms(percentile(tpots, 0.50)),
        "tpot_p99_ms": _ms(percentile(tpots, 0.99)),
        "tpot_mean_ms": _ms(sum(tpots) / len(tpots) if tpots else None),
        "itl_p50_ms": _ms(percentile(gaps, 0.50)),
        "itl_p99_ms": _ms(percentile(gaps, 0.99)),
        "ttft_p50_ms": _ms(percentile(ttfts, 0.50)),
        "ttft_p99_ms": _ms(percentile(ttfts, 0.99)),
    }


def _ms(value: float | None) -> float | None:
    return None if value is None else value * 1000
