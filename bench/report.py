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


def table(results: dict) -> str:
    rows = [
        "| scenario | mode | gateway | c=1 p50 / p99 ms | max req/s | p50 / p99 ms at ½ smg max "
        "| gw CPU ms/req | worker CPU ms/req | prefill leg bytes (pixel) "
        "| decode leg bytes (pixel) | media items/image |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    ratios = [
        "| scenario | mode | c=1 p50 T/S | max req/s T/S | gw CPU/req T/S |",
        "|---|---|---|---|---|",
    ]
    for mode in ("pd", "agg"):
        for name, res in results.get(mode, {}).items():
            for gw in ("tandem", "smg"):
                r = res[gw]
                c1, half = r["c1"], r.get("at_half_smg_max", {})
                legs = c1.get("legs", {})
                leg = {
                    k: f"{v['message_bytes']:.0f} ({v['pixel_bytes']:.0f})" for k, v in legs.items()
                }
                media = c1.get("media_items_per_image", c1.get("worker_media_items_per_image"))
                rows.append(
                    f"| {name} | {mode} | {gw} | {_f(c1['p50_ms'], 2)} / {_f(c1['p99_ms'], 2)} "
                    f"| {_f(r['sweep']['max_rate'])} "
                    f"| {_f(half.get('p50_ms'))} / {_f(half.get('p99_ms'))} "
                    f"| {_f(c1['gw_cpu_ms_per_req'], 2)} | {_f(c1['worker_cpu_ms_per_req'], 2)} "
                    f"| {leg.get('prefill', leg.get('aggregated', '–'))} "
                    f"| {leg.get('decode', '–')} "
                    f"| {_f(media, 2) if gw == 'tandem' else 'not exposed'} |"
                )
            t, s = res["tandem"], res["smg"]
            ratios.append(
                f"| {name} | {mode} | {_ratio(t['c1']['p50_ms'], s['c1']['p50_ms'])} "
                f"| {_ratio(t['sweep']['max_rate'], s['sweep']['max_rate'])} "
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


def plots(out: Path) -> None:
    python = PLOT_VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(PLOT_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "matplotlib"], check=True)
    subprocess.run([str(python), str(Path(__file__).with_name("plots.py")), str(out)], check=True)


def main(out: Path) -> None:
    results = json.loads((out / "results.json").read_text())
    print(table(results))
    plots(out)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
