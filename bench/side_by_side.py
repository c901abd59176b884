"""Tandem's gateway and smg side by side, fronting the same null workers, in one run.

    .venv/bin/python -m bench.side_by_side [--scenarios a b] [--point-seconds S] [--out DIR]

Gateways run on ``--gateway-cpus``; workers and the load generator on ``--load-cpus``.
Results go to ``DIR/results.json``; ``bench/report.py`` turns them into the table and plots.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from bench import measure
from bench.procs import (
    Proc,
    ensure_smg,
    free_port,
    rss_bytes,
    smg_version,
    start_smg,
    start_tandem,
    start_worker,
    wait_ready,
)
from bench.scenarios import MODEL, SCENARIOS, write_body
from tandem.hostport import split_url


def start_workers(cpus: str, delay_ms: float) -> dict[str, Proc]:
    started = {role: start_worker(role, cpus, delay_ms, MODEL) for role in ("prefill", "decode")}
    started["both"] = start_worker("both", cpus, delay_ms, MODEL)
    return {role: wait_ready(proc) for role, proc in started.items()}


# Tandem with --mm-jpeg-draft: an opt-in trade (pixels within a few levels of the exact
# ones) measured beside the default, on image scenarios only.
DRAFT = "tandem-draft"


def gateways_for(
    mode: str, workers: dict[str, Proc], cpus: str, draft: bool = False
) -> tuple[dict, dict]:
    roles = ("both",) if mode == "agg" else ("prefill", "decode")
    used = {r: workers[r] for r in roles}
    urls = {r: p.address for r, p in used.items()}
    gws = {"tandem": start_tandem(urls, cpus)}
    if draft:
        gws[DRAFT] = start_tandem(urls, cpus, "--mm-jpeg-draft")
    gws["smg"] = start_smg(urls, cpus, free_port(), free_port())
    return gws, used


def run_mode(mode: str, names: list[str], workers: dict, args, bodies: Path) -> dict:
    gws, used = gateways_for(mode, workers, args.gateway_cpus, draft=not args.no_draft_variant)
    out: dict = {}
    try:
        for name in names:
            scenario = SCENARIOS[name]
            if mode not in scenario.modes:
                continue
            body = write_body(scenario, bodies)
            res: dict = {}
            here = {n: g for n, g in gws.items() if n != DRAFT or scenario.images}
            for gw_name, gw in here.items():
                print(f"[bench] {name}/{mode}/{gw_name}: concurrency 1", flush=True)
                c1 = measure.idle(gw, used, body, args.load_cpus, args.c1_seconds, scenario.images)
                print(f"[bench]   p50 {c1['p50_ms']:.2f} ms; sweeping", flush=True)
                res[gw_name] = {
                    "c1": c1,
                    "sweep": measure.sweep(gw, body, args.load_cpus, c1, args.point_seconds),
                }
                print(f"[bench]   max {res[gw_name]['sweep']['max_rate']:.1f} req/s", flush=True)
            half = 0.5 * res["smg"]["sweep"]["max_rate"]
            for gw_name, gw in here.items():
                if half > 0:
                    res[gw_name]["at_half_smg_max"] = measure.at_rate(
                        gw, body, args.load_cpus, half, args.point_seconds
                    )
            out[name] = res
    finally:
        for gw in gws.values():
            gw.stop()
    return out


def rss_levels(gateway: Proc, body: Path, cpus: str, levels: list[int], seconds: float) -> dict:
    port = split_url(gateway.address, "http")[1]
    baseline = rss_bytes(gateway.pid)
    points = []
    for level in levels:
        peak = [0]
        stop = threading.Event()

        def sample(peak: list[int] = peak, stop: threading.Event = stop) -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], rss_bytes(gateway.pid))
                time.sleep(0.02)

        thread = threading.Thread(target=sample)
        thread.start()
        result = measure.loadgen(
            cpus, port, body, mode="closed", concurrency=level, duration_s=seconds
        )
        stop.set()
        thread.join()
        points.append({"in_flight": level, "peak_rss_mb": peak[0] / 2**20, "load": result})
    xs = [p["in_flight"] for p in points]
    ys = [p["peak_rss_mb"] for p in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )
    return {"baseline_rss_mb": baseline / 2**20, "points": points, "slope_mb_per_image": slope}


def run_rss(args, bodies: Path) -> dict:
    workers = start_workers(args.load_cpus, args.slow_token_ms)
    try:
        gws, _ = gateways_for("pd", workers, args.gateway_cpus)
        body = write_body(SCENARIOS["image_1024_stream"], bodies, max_tokens=args.slow_tokens)
        try:
            return {
                name: rss_levels(gw, body, args.load_cpus, [1, 8, 32], args.rss_seconds)
                for name, gw in gws.items()
            }
        finally:
            for gw in gws.values():
                gw.stop()
    finally:
        for w in workers.values():
            w.stop()


def machine() -> dict:
    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        platform.processor(),
    )
    mem = Path("/proc/meminfo").read_text().split()[1]
    tandem = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    return {
        "cpu": cpu,
        "cpus": len(__import__("os").sched_getaffinity(0)),
        "mem_gib": round(int(mem) / 2**20, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "smg": smg_version(),
        "tandem_commit": tandem,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--scenarios", nargs="*", default=list(SCENARIOS))
    p.add_argument("--modes", nargs="*", default=["agg", "pd"])
    p.add_argument("--c1-seconds", type=float, default=3.0)
    p.add_argument("--point-seconds", type=float, default=4.0)
    p.add_argument("--gateway-cpus", default="0")
    p.add_argument("--load-cpus", default="1")
    p.add_argument("--slow-token-ms", type=float, default=20.0)
    p.add_argument("--slow-tokens", type=int, default=50)
    p.add_argument("--rss-seconds", type=float, default=5.0)
    p.add_argument("--skip-rss", action="store_true")
    p.add_argument(
        "--no-draft-variant", action="store_true", help="skip Tandem with --mm-jpeg-draft"
    )
    p.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    args = p.parse_args()
    ensure_smg()
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict = {"machine": machine(), "args": {k: str(v) for k, v in vars(args).items()}}
    with tempfile.TemporaryDirectory(prefix="tandem-bench-") as tmp:
        workers = start_workers(args.load_cpus, 0.0)
        try:
            for mode in args.modes:
                results[mode] = run_mode(mode, args.scenarios, workers, args, Path(tmp))
                (args.out / "results.json").write_text(json.dumps(results, indent=1))
        finally:
            for w in workers.values():
                w.stop()
        if not args.skip_rss:
            print("[bench] RSS per in-flight image (slow workers)", flush=True)
            results["rss"] = run_rss(args, Path(tmp))
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    print(f"[bench] wrote {args.out / 'results.json'}", flush=True)


if __name__ == "__main__":
    main()
