"""Chaos soak (issue 38, item 4): mixed traffic over 2 prefill + 2 decode workers while a
driver kills and restarts (or stops and continues) a random worker every 20-40 s.

One PD gateway (``--health-check-interval-secs 1``, Responses history on SQLite in a temp
dir) over four ``tiny-qwen3-vl`` workers (the embedded engine unless ``--engine null``).
``--clients`` loops send chat (plain, streamed, with a small PNG), completions and
Responses (plain and streamed, in ``previous_response_id`` chains of 2-3 turns). Every
request is classified answered / coded error / lost (see bench/chaos_load.py); after the
load a settle reads each worker's Stats until no KV is held. The exit status is 1 when a
request was lost, KV is still held, or the chaos driver failed.

    .venv/bin/python -m bench.chaos_soak [--minutes 10] [--engine embedded|null] [--seed N]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections import Counter
from typing import Any

import httpx
import numpy as np

from bench.chaos_driver import Chaos
from bench.chaos_load import KINDS, Outcome, client_loop
from bench.chaos_procs import (
    HEALTH_INTERVAL_S,
    Child,
    gateway_args,
    spawn,
    stats,
    wait_ready,
    worker_args,
)

HELD_KEYS = ("held_kv_blocks", "held_transfers", "running")


def start_all(engine: str, delay_ms: float, history: str) -> tuple[list[Child], Child]:
    names = ["prefill-0", "prefill-1", "decode-0", "decode-1"]
    started = [spawn(n, worker_args(n.split("-")[0], 0, engine, delay_ms)) for n in names]
    workers = [wait_ready(w) for w in started]
    urls = [w.address for w in workers]
    gateway = wait_ready(spawn("gateway", gateway_args(urls[:2], urls[2:], history)))
    return workers, gateway


def settle(workers: list[Child], limit_s: float) -> tuple[dict[str, dict[str, Any]], float]:
    """Each worker's held counters once all are 0, or at ``limit_s`` (KV leases expire)."""
    began = time.monotonic()
    while True:
        held = {w.name: _held(w) for w in workers}
        clean = all(all(v == 0 for v in h.values()) for h in held.values())
        if clean or time.monotonic() - began > limit_s:
            return held, time.monotonic() - began
        time.sleep(0.5)


def _held(worker: Child) -> dict[str, Any]:
    counters = stats(worker.address)
    if counters is None:
        return {"stats": "no answer"}
    return {key: counters.get(key, 0) for key in HELD_KEYS}


def percentiles(outcomes: list[Outcome]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for kind in ("all", *KINDS):
        seconds = [
            o.latency_s for o in outcomes if o.verdict == "answered" and kind in ("all", o.kind)
        ]
        if seconds:
            p50, p99 = np.percentile(seconds, [50, 99])
            out[kind] = {"n": len(seconds), "p50_s": float(p50), "p99_s": float(p99)}
    return out


def summary(
    args: argparse.Namespace,
    outcomes: list[Outcome],
    chaos: Chaos,
    held: dict[str, dict[str, Any]],
    settle_s: float,
    gateway: Child,
    duration: float,
    began: float,
) -> dict[str, Any]:
    verdicts = Counter(o.verdict for o in outcomes)
    codes = Counter(o.code for o in outcomes if o.verdict == "coded")
    examples: dict[str, list[dict[str, Any]]] = {}
    for o in outcomes:
        key = "lost" if o.verdict == "lost" else o.code
        if o.verdict != "answered" and (key == "lost" or len(examples.get(key, [])) < 3):
            row = {"kind": o.kind, "at_s": round(o.started - began, 2), "detail": o.detail}
            examples.setdefault(key, []).append(row | {"latency_s": round(o.latency_s, 2)})
    return {
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "engine": args.engine,
        "seed": args.seed,
        "gap_s": list(args.gap_s),
        "stop_share": args.stop_share,
        "clients": args.clients,
        "cpus": os.cpu_count(),
        "command": "python -m bench.chaos_soak " + " ".join(sys.argv[1:]),
        "load_avg_1m_at_start": args.load_at_start,
        "load_avg_1m_at_end": os.getloadavg()[0],
        "duration_s": round(duration, 1),
        "sent": len(outcomes),
        "answered": verdicts["answered"],
        "coded": dict(codes),
        "lost": verdicts["lost"],
        "by_kind": dict(Counter(o.kind for o in outcomes)),
        "latency": percentiles(outcomes),
        "kv_held_at_end": held,
        "settle_s": round(settle_s, 1),
        "restarts": [r.as_dict() for r in chaos.rounds],
        "recovery": recovery_summary([r.as_dict() for r in chaos.rounds]),
        "recovery_target_s": 2.0 * HEALTH_INTERVAL_S,
        "chaos_error": chaos.error,
        "gateway_tracebacks": gateway.tracebacks,
        "examples": examples,
    }


def recovery_summary(rounds: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per signal: rounds, median and max of routed_s and recovery_s, rounds never recovered."""
    out: dict[str, dict[str, Any]] = {}
    for sig in sorted({r["signal"] for r in rounds}):
        mine = [r for r in rounds if r["signal"] == sig]
        row: dict[str, Any] = {"rounds": len(mine)}
        for key in ("routed_s", "recovery_s"):
            seen = [r[key] for r in mine if r[key] is not None]
            row[f"{key}_median"] = float(np.median(seen)) if seen else None
            row[f"{key}_max"] = max(seen) if seen else None
            row[f"{key}_missing"] = len(mine) - len(seen)
        out[sig] = row
    return out


def held_total(held: dict[str, dict[str, Any]]) -> int:
    return sum(1 if not isinstance(v, int) else v for h in held.values() for v in h.values())


def print_report(report: dict[str, Any]) -> None:
    print(f"\nchaos soak {report['date_utc']} UTC, engine {report['engine']}, seed "
          f"{report['seed']}, {report['clients']} clients, {report['cpus']} CPUs, load avg "
          f"{report['load_avg_1m_at_start']:.1f} at start, "
          f"{report['load_avg_1m_at_end']:.1f} at end")  # fmt: skip
    print(f"duration {report['duration_s']} s  sent {report['sent']}  answered "
          f"{report['answered']}  coded {sum(report['coded'].values())} {report['coded']}  "
          f"lost {report['lost']}")  # fmt: skip
    print("| kind | answered | p50 s | p99 s |\n|---|---|---|---|")
    for kind, row in report["latency"].items():
        print(f"| {kind} | {row['n']} | {row['p50_s']:.2f} | {row['p99_s']:.2f} |")
    print("| restart at s | worker | signal | down s | routed s | recovery s |")
    print("|---|---|---|---|---|---|")
    for r in report["restarts"]:
        routed, rec = (_seconds(r[key]) for key in ("routed_s", "recovery_s"))
        print(f"| {r['at_s']:.1f} | {r['worker']} | {r['signal']} | {r['down_s']:.2f} "
              f"| {routed} | {rec} |")  # fmt: skip
    for sig, row in report["recovery"].items():
        print(f"{sig}: {row['rounds']} rounds; routed median {_seconds(row['routed_s_median'])} "
              f"max {_seconds(row['routed_s_max'])}; answered median "
              f"{_seconds(row['recovery_s_median'])} max {_seconds(row['recovery_s_max'])}; "
              f"never answered {row['recovery_s_missing']} "
              f"(target {report['recovery_target_s']:.1f} s)")  # fmt: skip
    print(f"KV held at end (after {report['settle_s']} s settle): {report['kv_held_at_end']}")
    print(f"gateway tracebacks: {report['gateway_tracebacks']}")
    if report["chaos_error"]:
        print(f"chaos driver failed: {report['chaos_error']}")
    for key, rows in report["examples"].items():
        for row in rows[:5]:
            print(f"example {key}: {row}")


def _seconds(value: float | None) -> str:
    return "none" if value is None else f"{value:.2f}"


async def load(base_url: str, args: argparse.Namespace, stop_at: float) -> list[Outcome]:
    outcomes: list[Outcome] = []
    loops = [
        client_loop(base_url, args.seed * 1000 + i, stop_at, args.timeout, outcomes)
        for i in range(args.clients)
    ]
    await asyncio.gather(*loops)
    return outcomes


def warm(base_url: str) -> None:
    """One answer through the whole path before the clock starts (first-call compiles)."""
    body = {"model": "tiny-qwen3-vl", "messages": [{"role": "user", "content": "hi"}]}
    httpx.post(f"{base_url}/v1/chat/completions", json=body | {"max_tokens": 4}, timeout=120)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--engine", choices=("embedded", "null"), default="embedded")
    p.add_argument("--seed", type=int, default=38)
    p.add_argument("--clients", type=int, default=5)
    p.add_argument("--timeout", type=float, default=60.0, help="client timeout per request")
    p.add_argument("--stop-share", type=float, default=0.25, help="rounds that SIGSTOP")
    p.add_argument(
        "--gap-s", type=float, nargs=2, default=[20.0, 40.0], help="seconds between rounds"
    )
    p.add_argument("--settle-s", type=float, default=45.0, help="longest wait for KV to drain")
    p.add_argument("--null-token-delay-ms", type=float, default=20.0)
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    args.load_at_start = os.getloadavg()[0]  # the machine may be shared: say how busy it was
    return args


def soak(args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
    """The report, and the gateway's last log lines (a lost request's or traceback's story)."""
    with tempfile.TemporaryDirectory(prefix="tandem-chaos-") as tmp:
        workers, gateway = start_all(args.engine, args.null_token_delay_ms, f"{tmp}/h.sqlite3")
        try:
            warm(gateway.address)
            began = time.monotonic()
            stop_at = began + args.minutes * 60.0
            chaos = Chaos(workers, args.seed, began, stop_at, args.stop_share, args.gap_s)
            chaos.start()
            outcomes = asyncio.run(load(gateway.address, args, stop_at))
            duration = time.monotonic() - began
            chaos.join(RECOVERY_JOIN_S)
            held, settle_s = settle(workers, args.settle_s)
            report = summary(args, outcomes, chaos, held, settle_s, gateway, duration, began)
        finally:
            for child in (gateway, *workers):
                child.kill()
    return report, list(gateway.lines)


def failed(report: dict[str, Any]) -> bool:
    """The soak's verdict: a request lost, KV still held, or the chaos driver broke."""
    return (
        report["lost"] > 0
        or held_total(report["kv_held_at_end"]) > 0
        or bool(report["chaos_error"])
    )


def main() -> int:
    args = parse_args()
    report, gateway_lines = soak(args)
    print_report(report)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=2)
        with open(args.json + ".gateway.log", "w") as out:
            out.write("\n".join(gateway_lines) + "\n")
    return 1 if failed(report) else 0


RECOVERY_JOIN_S = 120.0

if __name__ == "__main__":
    raise SystemExit(main())
