"""Token timing of SSE chat streams as a client sees them (docs/benchmarks.md, "mixed load").

The load generator records when each HTTP chunk of a streamed answer arrived; here those
arrivals become the times of the SSE events that carry generated text, and per-stream TPOT
(time per output token after the first: the mean gap between consecutive content events)
and the gaps themselves (inter-token latency, ITL) are summarised over many streams.
"""

from __future__ import annotations

import itertools
import json

from bench.loadgen_stats import percentile


def content_times(chunks: list[tuple[float, bytes]]) -> list[float]:
    """Arrival time of every SSE event with non-empty ``delta.content``, in order.

    An event split across HTTP chunks counts when its last byte arrived; events that share
    a chunk share its time (a gateway that batches frames into one write shows gaps of 0).
    """
    times: list[float] = []
    pending = b""
    for at, data in chunks:
        pending += data
        *events, pending = pending.replace(b"\r\n", b"\n").split(b"\n\n")
        times.extend(at for event in events if _has_content(event))
    if pending.strip() and _has_content(pending):
        times.append(chunks[-1][0])
    return times


def _has_content(event: bytes) -> bool:
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
        if any((c.get("delta") or {}).get("content") for c in choices):
            return True
    return False


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
