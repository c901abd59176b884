"""The figures of ``bench.epd_reuse``: one configuration's run summed up from the workers'
Stats and CPU times before and after it, the medians over rounds, the markdown table, and
the answers that differ from PD's."""

from __future__ import annotations

import os
import statistics
from typing import Any

from bench.epd_workload import Turn
from bench.loadgen_stats import percentile


def grew(before: dict, after: dict, *path: str) -> int:
    """``after[path] - before[path]`` (a missing key counts 0)."""
    b: Any = before
    a: Any = after
    for key in path:
        b, a = b.get(key, {}), a.get(key, {})
    return int(a or 0) - int(b or 0)


def summarize(config: str, order: list[Turn], answers: list[dict], measured: dict) -> dict:
    """The figures of one configuration's run from its answers and the two snapshots."""
    n, before, after = len(answers), measured["before"], measured["after"]
    cpu = {r: (after["cpu_s"][r] - before["cpu_s"][r]) / n for r in after["cpu_s"]}
    b, a = before["stats"], after["stats"]
    out: dict = {
        "config": config,
        "requests": n,
        "images_sent": sum(t.turn + 1 for t in order),
        "wall_s": measured["wall_s"],
        "cpu_s_per_request": cpu,
        "worker_cpu_s_per_request": sum(v for r, v in cpu.items() if r != "gateway"),
        "ttft_ms": _pcts([1000 * x["ttft_s"] for x in answers if x["ttft_s"] is not None]),
        "latency_ms": _pcts([1000 * x["latency_s"] for x in answers]),
        "no_content": sum(x["ttft_s"] is None for x in answers),
        "prefill_vision_encodes": grew(b["prefill"], a["prefill"], "vision_encodes"),
        "decode_vision_encodes": grew(b["decode"], a["decode"], "vision_encodes"),
        "prefill_prefix_hit_tokens": grew(b["prefill"], a["prefill"], "prefix_cache_hit_tokens"),
        "prefill_computed_tokens": grew(b["prefill"], a["prefill"], "prefill_computed_tokens"),
        "load_average_before": measured["load_average_before"],
        "load_average_after": os.getloadavg(),
        "answers": [x["text"] for x in answers],
        "stats_after": a,
    }
    if "encode" in a:
        hits = grew(b["encode"], a["encode"], "embedding_cache", "hits")
        misses = grew(b["encode"], a["encode"], "embedding_cache", "misses")
        out["encode"] = {
            "accepted": grew(b["encode"], a["encode"], "encode_requests", "accepted"),
            "vision_encodes": grew(b["encode"], a["encode"], "encoder", "vision_encodes"),
            "features_pulled": grew(b["encode"], a["encode"], "embedding_store", "taken"),
            "cache_hits": hits,
            "cache_misses": misses,
            "cache_hit_rate": hits / (hits + misses) if hits + misses else None,
        }
    return out


def _pcts(values: list[float]) -> dict:
    return {"p50": percentile(values, 0.5), "p90": percentile(values, 0.9), "n": len(values)}


def table(rows: list[tuple[str, dict]]) -> str:
    head = (
        "| config | prefill CPU ms/req | encode CPU ms/req | all workers CPU ms/req "
        "| gateway CPU ms/req | TTFT p50 / p90 ms | wall s | embedding cache hit rate "
        "| encodes run (encoder) | vision encodes on the prefill |"
    )
    return "\n".join([head, "|" + "---|" * 10, *(row(name, r) for name, r in rows)])


def medians(runs: list[dict]) -> dict:
    """The table's figures of one configuration, each the median over the rounds."""
    med, first = statistics.median, runs[0]
    out: dict = {
        "cpu_s_per_request": {
            k: med(r["cpu_s_per_request"][k] for r in runs) for k in first["cpu_s_per_request"]
        },
        "worker_cpu_s_per_request": med(r["worker_cpu_s_per_request"] for r in runs),
        "ttft_ms": {q: med(r["ttft_ms"][q] for r in runs) for q in ("p50", "p90")},
        "latency_ms": {q: med(r["latency_ms"][q] for r in runs) for q in ("p50", "p90")},
        "wall_s": med(r["wall_s"] for r in runs),
        "prefill_vision_encodes": max(r["prefill_vision_encodes"] for r in runs),
    }
    if "encode" in first:
        rates = [r["encode"]["cache_hit_rate"] for r in runs]
        out["encode"] = {
            "cache_hit_rate": None if None in rates else med(rates),
            "vision_encodes": max(r["encode"]["vision_encodes"] for r in runs),
        }
    return out


def row(name: str, r: dict) -> str:
    cpu, enc = r["cpu_s_per_request"], r.get("encode")
    ms = {role: f"{1000 * v:.1f}" for role, v in cpu.items()}
    rate = "–" if not enc or enc["cache_hit_rate"] is None else f"{enc['cache_hit_rate']:.0%}"
    cells = [
        name,
        ms["prefill"],
        ms.get("encode", "–"),
        f"{1000 * r['worker_cpu_s_per_request']:.1f}",
        ms["gateway"],
        f"{r['ttft_ms']['p50']:.1f} / {r['ttft_ms']['p90']:.1f}",
        f"{r['wall_s']:.1f}",
        rate,
        str(enc["vision_encodes"]) if enc else "–",
        str(r["prefill_vision_encodes"]),
    ]
    return "| " + " | ".join(cells) + " |"


def mismatches(rounds: list[dict[str, dict]], order: list[Turn]) -> list[dict]:
    """Every answer that differs from the first round's PD answer to the same request."""
    expected = rounds[0]["pd"]["answers"]
    return [
        {"round": n + 1, "config": name, "request": i, "conversation": t.conversation,
         "turn": t.turn, "pd": expected[i], "got": got}
        for n, results in enumerate(rounds) for name, r in results.items()
        for i, (t, got) in enumerate(zip(order, r["answers"], strict=True)) if got != expected[i]
    ]  # fmt: skip
