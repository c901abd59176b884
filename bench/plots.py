"""Plots of results.json; run with the bench's own matplotlib venv (never the project's).

~/.cache/tandem/bench/plot-venv/bin/python bench/plots.py docs/benchmarks
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def latency_plot(results: dict, mode: str, name: str, out: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    for gw, res in results[mode][name].items():
        pts = [p for p in res["sweep"]["points"] if p["p99_ms"] is not None]
        ax.plot(
            [p["offered_rate"] for p in pts], [p["p50_ms"] for p in pts], "o-", label=f"{gw} p50"
        )
        ax.plot(
            [p["offered_rate"] for p in pts], [p["p99_ms"] for p in pts], "x--", label=f"{gw} p99"
        )
    ax.set_xlabel("offered rate (req/s, open loop)")
    ax.set_ylabel("latency (ms)")
    ax.set_yscale("log")
    ax.set_title(f"{name} ({mode})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / f"latency-{name}-{mode}.png", dpi=90)
    plt.close(fig)


def rss_plot(results: dict, out: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    for gw, res in results["rss"].items():
        xs = [p["in_flight"] for p in res["points"]]
        ax.plot(xs, [p["peak_rss_mb"] for p in res["points"]], "o-", label=gw)
    ax.set_xlabel("in-flight images (1024x1024 JPEG, PD, slow workers)")
    ax.set_ylabel("gateway peak RSS (MiB)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "rss-in-flight-images.png", dpi=90)
    plt.close(fig)


def main(out: Path) -> None:
    results = json.loads((out / "results.json").read_text())
    for mode in ("agg", "pd"):
        for name in results.get(mode, {}):
            latency_plot(results, mode, name, out)
    if "rss" in results:
        rss_plot(results, out)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
