"""results.json → the figures table of docs/benchmarks.md (printed) and the PNG plots.

    .venv/bin/python -m bench.report docs/benchmarks > table.md

Plots are drawn by ``bench/plots.py`` in its own venv (matplotlib, made on first use).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.procs import BENCH_HOME
from bench.variants import ALL, PAIRS

PLOT_VENV = BENCH_HOME / "plot-venv"


def _f(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "–" if not a or not b else f"{a / b:.2f}"


def overload(result: dict) -> float | None:
    """Highest rate actually served at any sweep point: the throughput once overloaded.

    The sweep's offered rates rise ×1.5, so "max req/s" (the last passing point) can sit up
    to a third below what a gateway sustains; this figure does not depend on that step.
    """
    served = [p.get("achieved_rate") or 0 for p in result["sweep"].get("points", [])]
    return max(served, default=0) or None


def table(results: dict) -> str:
    rows = [
        "| scenario | mode | gateway | c=1 p50 / p99 ms | max req/s (at overload) "
        "| p50 / p99 ms at ½ smg max "
        "| gw CPU ms/req | worker CPU ms/req | prefill leg bytes (pixel) "
        "| decode leg bytes (pixel) | media items/image |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    ratios = [
        "| scenario | mode | c=1 p50 T/S | max req/s T/S | at overload T/S | gw CPU/req T/S |",
        "|---|---|---|---|---|---|",
    ]
    for mode in ("pd", "agg"):
        for name, res in results.get(mode, {}).items():
            for gw in [g for g in ALL if g in res]:
                r = res[gw]
                c1, half = r["c1"], r.get("at_half_smg_max", {})
                legs = c1.get("legs", {})
                leg = {
                    k: f"{v['message_bytes']:.0f} ({v['pixel_bytes']:.0f})" for k, v in legs.items()
                }
                media = c1.get("media_items_per_image", c1.get("worker_media_items_per_image"))
                rows.append(
                    f"| {name} | {mode} | {gw} | {_f(c1['p50_ms'], 2)} / {_f(c1['p99_ms'], 2)} "
                    f"| {_f(r['sweep']['max_rate'])} ({_f(overload(r))}) "
                    f"| {_f(half.get('p50_ms'))} / {_f(half.get('p99_ms'))} "
                    f"| {_f(c1['gw_cpu_ms_per_req'], 2)} | {_f(c1['worker_cpu_ms_per_req'], 2)} "
                    f"| {leg.get('prefill', leg.get('aggregated', '–'))} "
                    f"| {leg.get('decode', '–')} "
                    f"| {_f(media, 2) if not gw.startswith('smg') else 'not exposed'} |"
                )
            for gw, ref in [(t, s) for t, s in PAIRS if t in res and s in res]:
                t, s = res[gw], res[ref]
                label = mode if gw == "tandem" else f"{mode} ({gw.removeprefix('tandem-')})"
                ratios.append(
                    f"| {name} | {label} | {_ratio(t['c1']['p50_ms'], s['c1']['p50_ms'])} "
                    f"| {_ratio(t['sweep']['max_rate'], s['sweep']['max_rate'])} "
                    f"| {_ratio(overload(t), overload(s))} "
                    f"| {_ratio(t['c1']['gw_cpu_ms_per_req'], s['c1']['gw_cpu_ms_per_req'])} |"
                )
    out = "\n".join(rows) + "\n\nTandem/smg ratios (T/S):\n\n" + "\n".join(ratios) + "\n"
    if "rss" in results:
        out += "\n| gateway | baseline RSS MiB | peak RSS MiB at 1 / 8 / 32 in flight "
        out += "| slope MiB/image |\n"
        out += "|---|---|---|---|\n"
        for gw, r in results["rss"].items():
            peaks = " / ".join(f"{p['peak_rss_mb']:.0f}" for p in r["points"])
            out += (
                f"| {gw} | {r['baseline_rss_mb']:.0f} | {peaks} | {r['slope_mb_per_image']:.2f} |\n"
            )
    return out


def multi_turn(results: dict) -> str:
    """The multi-turn image chat: req/s and gateway CPU per request, ratios per pair."""
    runs = results.get("multi_turn") or {}
    if not runs:
        return ""
    rows = [
        "| gateway | req/s | p50 / p99 ms | gw CPU ms/req | conversations | errors |",
        "|---|---|---|---|---|---|",
    ]
    for gw in [g for g in ALL if g in runs]:
        r = runs[gw]
        rows.append(
            f"| {gw} | {_f(r.get('achieved_rate'))} | {_f(r.get('p50_ms'))} / "
            f"{_f(r.get('p99_ms'))} | {_f(r.get('gw_cpu_ms_per_req'), 2)} "
            f"| {r.get('conversations_completed', '–')} | {r.get('error_count', 0)} |"
        )
    for t, s in PAIRS:
        if t in runs and s in runs:
            rate = _ratio(runs[t].get("achieved_rate"), runs[s].get("achieved_rate"))
            cpu = _ratio(runs[t].get("gw_cpu_ms_per_req"), runs[s].get("gw_cpu_ms_per_req"))
            rows.append(f"| {t} / {s} | {rate}× | | {cpu}× | | |")
    return "Multi-turn image chat (3 turns, history re-sent):\n\n" + "\n".join(rows) + "\n"


def mixed(results: dict) -> str:
    """Text-stream TPOT p50/p99 alone and under image load, per gateway."""
    runs = results.get("mixed") or {}
    if not runs:
        return ""
    rows = [
        "| gateway | text TPOT p50 / p99 ms alone | with images | ITL p99 alone / with "
        "| text TTFT p50 alone / with | image p50 / p99 ms | errors text / images |",
        "|---|---|---|---|---|---|---|",
    ]
    for gw in [g for g in ALL if g in runs]:
        r = runs[gw]
        a, b = r["text_alone"], r["text_with_images"]
        ta, tb = a.get("stream_timing", {}), b.get("stream_timing", {})
        img = r.get("images", {})
        rows.append(
            f"| {gw} | {_f(ta.get('tpot_p50_ms'), 3)} / {_f(ta.get('tpot_p99_ms'), 3)} "
            f"| {_f(tb.get('tpot_p50_ms'), 3)} / {_f(tb.get('tpot_p99_ms'), 3)} "
            f"| {_f(ta.get('itl_p99_ms'), 2)} / {_f(tb.get('itl_p99_ms'), 2)} "
            f"| {_f(ta.get('ttft_p50_ms'), 2)} / {_f(tb.get('ttft_p50_ms'), 2)} "
            f"| {_f(img.get('p50_ms'))} / {_f(img.get('p99_ms'))} "
            f"| {a.get('error_count', 0) + b.get('error_count', 0)} / {img.get('error_count', 0)} |"
        )
    for t, s in PAIRS:
        if t in runs and s in runs:
            get = lambda gw: runs[gw]["text_with_images"].get("stream_timing", {})  # noqa: E731
            p50 = _ratio(get(t).get("tpot_p50_ms"), get(s).get("tpot_p50_ms"))
            p99 = _ratio(get(t).get("tpot_p99_ms"), get(s).get("tpot_p99_ms"))
            rows.append(f"| {t} / {s} | | {p50}× / {p99}× | | | | |")
    some = next(iter(runs.values()))["rates"]
    head = (
        f"Mixed load (text streams of 64 tokens at {some['text']:g}/s; images at "
        f"{some['image']:g}/s in the second phase):\n\n"
    )
    return head + "\n".join(rows) + "\n"


VLLM_FIGURES = (
    ("request_throughput_req_s", "req/s"),
    ("output_token_throughput_tok_s", "out tok/s"),
    ("mean_ttft_ms", "mean TTFT ms"),
    ("p99_ttft_ms", "p99 TTFT ms"),
    ("mean_tpot_ms", "mean TPOT ms"),
    ("median_tpot_ms", "median TPOT ms"),
    ("p99_tpot_ms", "p99 TPOT ms"),
    ("p99_itl_ms", "p99 ITL ms"),
)


def vllm_table(results: dict) -> str:
    """``vllm bench serve`` figures per gateway and dataset (its own result lines)."""
    vb = results.get("vllm_bench") or {}
    if "skipped" in vb:
        return f"vllm bench serve: skipped ({vb['skipped']}).\n"
    runs = vb.get("runs") or {}
    if not runs:
        return ""
    rows = [
        "| dataset | gateway | " + " | ".join(label for _, label in VLLM_FIGURES) + " |",
        "|---|---|" + "---|" * len(VLLM_FIGURES),
    ]
    datasets = sorted({d for r in runs.values() for d in r})
    for dataset in datasets:
        for gw in [g for g in ALL if dataset in runs.get(g, {})]:
            run = runs[gw][dataset]
            if run.get("error"):
                rows.append(f"| {dataset} | {gw} | failed: {run['error'][:80]} |")
                continue
            m = run["metrics"]
            cells = " | ".join(_f(m.get(k), 2) for k, _ in VLLM_FIGURES)
            rows.append(f"| {dataset} | {gw} | {cells} |")
    head = (
        f"vllm bench serve (--backend openai-chat, concurrency {vb.get('concurrency')}, "
        f"{vb.get('prompts')} prompts a run):\n\n"
    )
    return head + "\n".join(rows) + "\n"


def _cpu_count(spec: str) -> int:
    """CPUs in a taskset list such as ``1``, ``1,3`` or ``2-5``."""
    total = 0
    for part in spec.split(","):
        low, _, high = part.partition("-")
        total += int(high or low) - int(low) + 1
    return total


def headroom(results: dict) -> str:
    """Are the null workers the bottleneck? Their CPU at the fastest gateway's max rate."""
    cpus = _cpu_count(results.get("args", {}).get("load_cpus", "1"))
    rows = [
        f"Worker headroom (workers and load generator share {cpus} CPU(s); ≥ 3× wanted):\n",
        "| scenario | mode | fastest max req/s | worker CPU ms/req | worker share of those CPUs "
        "| headroom |",
        "|---|---|---|---|---|---|",
    ]
    for mode in ("pd", "agg"):
        for name, res in results.get(mode, {}).items():
            rate = max(r["sweep"]["max_rate"] or 0 for r in res.values())
            per_req = [r["c1"]["worker_cpu_ms_per_req"] for r in res.values()]
            worker_ms = sum(per_req) / len(per_req)
            share = rate * worker_ms / 1000 / cpus
            room = 1 / share if share else float("inf")
            verdict = "ok" if room >= 3 else "**< 3×: worker-bound**"
            rows.append(
                f"| {name} | {mode} | {_f(rate)} | {_f(worker_ms, 2)} | {share:.0%} "
                f"| {room:.1f}× {verdict} |"
            )
    return "\n".join(rows) + "\n"


def plots(out: Path) -> None:
    python = PLOT_VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(PLOT_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "matplotlib"], check=True)
    subprocess.run([str(python), str(Path(__file__).with_name("plots.py")), str(out)], check=True)


def main(out: Path) -> None:
    results = json.loads((out / "results.json").read_text())
    print(table(results))
    print(headroom(results))
    for section in (multi_turn(results), mixed(results), vllm_table(results)):
        if section:
            print(section)
    plots(out)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
