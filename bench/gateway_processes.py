"""Requests per second of ``tandem gateway --processes N`` for N = 1, 2, ... over a null worker.

Usage: .venv/bin/python -m bench.gateway_processes [--processes 1,2] [--seconds 10]
       [--concurrency 32] [--layouts pinned,spread] [--out FILE]

One null-engine worker (answers at once) and the load generator (``bench.loadgen``, closed
loop, keep-alive connections) run on ``--load-cpus``; the gateway runs under ``taskset`` on
the CPUs of each layout:

- ``pinned``: the gateway alone on ``--gateway-cpus`` (CPU 0 by default). On a 2-core host
  this gives N = 2 one CPU too: it measures what a second process costs, not what it gains.
- ``spread``: the gateway on every CPU, sharing ``--load-cpus`` with the worker and the load
  generator; N = 2 can use the second core, as far as the load generator leaves it free.

Each run is a short warm-up, then ``--seconds`` at ``--concurrency``; the report gives
req/s, p50/p99 latency, errors, the gateway's CPU seconds per request (supervisor and
children together), how the work split over the children (their CPU seconds), and how
busy each side kept its CPUs (CPU seconds per wall second: the gateway's, and the worker's
plus the load generator's), which says which side limited the run.
Loopback only; every process is stopped by its own pid.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time
from pathlib import Path

from bench.measure import loadgen
from bench.procs import Proc, cpu_seconds, start_tandem, start_worker, wait_ready
from tandem.hostport import split_url

MODEL = "tiny-qwen3-vl"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 4}
WARMUP_S = 2.0


def children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid:
            found.append(int(stat.parent.name))
    return sorted(found)


def one_run(
    worker: Proc, processes: int, gateway_cpus: str, args: argparse.Namespace, tmp: Path
) -> dict:
    history = ["--history-sqlite-path", str(tmp / f"h-{processes}-{gateway_cpus}.sqlite3")]
    flags = ["--processes", str(processes), "--mm-workers", "0", "--no-access-log", *history]
    gateway = start_tandem({"both": worker.address}, gateway_cpus, *flags, name="tandem")
    try:
        port = split_url(gateway.address, "http")[1]
        body = tmp / "body.json"
        body.write_text(json.dumps(BODY))
        conc = args.concurrency
        loadgen(args.load_cpus, port, body, mode="closed", concurrency=conc, duration_s=WARMUP_S)
        kids = children(gateway.pid) if processes > 1 else []
        gw_before, worker_before = cpu_seconds(gateway.pid), cpu_seconds(worker.pid)
        kids_before = [cpu_seconds(k) for k in kids]
        loadgen_before = _children_cpu()
        result = loadgen(
            args.load_cpus, port, body, mode="closed", concurrency=conc, duration_s=args.seconds
        )
        loadgen_cpu = _children_cpu() - loadgen_before  # the load generator has ended: waited
        gw_cpu = cpu_seconds(gateway.pid) - gw_before
        worker_cpu = cpu_seconds(worker.pid) - worker_before
        kids_cpu = [cpu_seconds(k) - b for k, b in zip(kids, kids_before, strict=True)]
    finally:
        gateway.stop()
    ok = result["ok"] or 1
    return {
        "processes": processes,
        "gateway_cpus": gateway_cpus,
        "req_per_s": round(result["achieved_rate"], 1),
        "p50_ms": _round(result["p50_ms"]),
        "p99_ms": _round(result["p99_ms"]),
        "ok": result["ok"],
        "errors": result["errors"],
        "gateway_cpu_ms_per_request": round(gw_cpu / ok * 1000, 3),
        "children_cpu_s": [round(c, 2) for c in kids_cpu],
        # CPU seconds per wall second: how busy each side kept the CPUs it had.
        "gateway_cpu_busy": round(gw_cpu / result["wall_s"], 2),
        "load_cpu_busy": round((loadgen_cpu + worker_cpu) / result["wall_s"], 2),
    }


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--processes", default="1,2", help="comma-separated N values")
    p.add_argument("--layouts", default="pinned,spread")
    p.add_argument("--gateway-cpus", default="0", help="the gateway's CPUs in layout pinned")
    p.add_argument("--load-cpus", default="1", help="the worker's and load generator's CPUs")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    every_cpu = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    layouts = {"pinned": args.gateway_cpus, "spread": every_cpu}
    counts = [int(n) for n in args.processes.split(",")]
    worker = wait_ready(start_worker("both", args.load_cpus, 0, MODEL))
    runs = []
    try:
        with tempfile.TemporaryDirectory(prefix="tandem-bench-processes-") as tmp:
            for layout in args.layouts.split(","):
                for n in counts:
                    run = one_run(worker, n, layouts[layout], args, Path(tmp))
                    runs.append({"layout": layout, **run})
                    print(json.dumps(runs[-1]), flush=True)
    finally:
        worker.stop()
    report = {
        "bench": "gateway_processes",
        "cpus": len(os.sched_getaffinity(0)),
        "load_average_at_end": os.getloadavg(),
        "load_cpus": args.load_cpus,
        "concurrency": args.concurrency,
        "seconds": args.seconds,
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "runs": runs,
    }
    text = json.dumps(report, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
