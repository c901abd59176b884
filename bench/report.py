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
            for gw in [g for g in ("tandem", "tandem-draft", "smg") if g in res]:
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
                    f"| {_f(media, 2) if gw != 'smg' else 'not exposed'} |"
                )
            s = res["smg"]
            for gw in [g for g in ("tandem", "tandem-draft") if g in res]:
                t = res[gw]
                label = mode if gw == "tandem" else f"{mode} (draft)"
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
    plots(out)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
