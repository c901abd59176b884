"""E/P/D against PD on one machine, on multi-turn image chats with 80 % image reuse.

``.venv/bin/python -m bench.epd_reuse --out DIR`` starts, for each configuration in turn,
fresh TokenSpeed-protocol workers of the built-in model (embedded engine, real forward
passes) and a Tandem gateway on 127.0.0.1: (a) ``pd``: prefill + decode; (b) ``epd``: an
encode worker (default embedding cache) + prefill + decode; (c) ``epd-nocache``: the same
with ``--embedding-cache-mb 0``. Each gets the same seeded workload (``bench.epd_workload``)
sent one streamed request at a time (greedy, ``--max-tokens`` 8) after one warm-up request
whose image is not in the workload. Measured per configuration: CPU seconds per request of
every worker process (utime + stime from /proc, descendants included) and of the gateway,
TTFT (request sent → first content token) and latency from the client, wall time, the
workers' Stats deltas (vision encodes on the prefill, the encoder's encodes and embedding
cache). ``--rounds`` (3) repeats all of it, the configurations' order reversed every other
round. Every answer must equal the first round's PD answer, and an E/P/D prefill must run no
vision tower: anything else fails the run (exit status 1, the cases printed and in the
JSON). Writes ``DIR/epd_reuse.json`` and prints markdown tables (medians, then each round).
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.epd_figures import medians, mismatches, summarize, table
from bench.epd_workload import CONVERSATIONS, TURNS, Workload, plan
from bench.measure import worker_stats
from bench.procs import HOST, READY, Proc, cpu_seconds, spawn, wait_ready
from tandem.engine.builtin_shapes import draw
from tandem.hostport import split_url

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ("pd", "epd", "epd-nocache")
CPUS = f"0-{(os.cpu_count() or 1) - 1}"  # no pinning: every process may use every CPU


def start(config: str, model: str) -> dict[str, Proc]:
    """Fresh workers for ``config`` (started together), then their gateway."""
    base = [sys.executable, "-m", "tandem.cli", "worker", "--model", model, "--host", HOST]
    base += ["--port", "0", "--protocol", "tokenspeed", "--log-level", "warning"]
    roles = {"prefill": ["--role", "prefill"], "decode": ["--role", "decode"]}
    if config != "pd":
        roles["encode"] = ["--role", "encode"]
        if config == "epd-nocache":
            roles["encode"] += ["--embedding-cache-mb", "0"]
    spawned = {role: spawn(role, CPUS, [*base, *args], READY) for role, args in roles.items()}
    procs: dict[str, Proc] = {}
    try:
        for role, proc in spawned.items():
            procs[role] = wait_ready(proc)
        gw = [sys.executable, "-m", "tandem.cli", "gateway", "--host", HOST, "--port", "0"]
        gw += ["--log-level", "warning"]
        if config == "pd":
            gw.append("--pd-disaggregation")
        else:
            gw += ["--epd-disaggregation", "--encode", procs["encode"].address]
        gw += ["--prefill", procs["prefill"].address, "--decode", procs["decode"].address]
        procs["gateway"] = wait_ready(spawn("gateway", CPUS, gw, READY))
    except BaseException:
        stop(spawned)
        raise
    return procs


def stop(procs: dict[str, Proc]) -> None:
    for proc in procs.values():
        proc.stop()


def chat(port: int, model: str, messages: list[dict], max_tokens: int) -> dict:
    """One streamed greedy chat completion: its text, TTFT and latency (seconds)."""
    body = json.dumps(
        {
            "model": model,
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
        }
    )
    conn = http.client.HTTPConnection(HOST, port, timeout=120)
    start = time.perf_counter()
    first, parts = None, []
    try:
        conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        reply = conn.getresponse()
        if reply.status != 200:
            raise RuntimeError(f"HTTP {reply.status}: {reply.read()[:500]!r}")
        for raw in reply:
            line = raw.strip()
            if not line.startswith(b"data:") or line == b"data: [DONE]":
                continue
            for choice in json.loads(line[5:]).get("choices", []):
                text = (choice.get("delta") or {}).get("content") or ""
                if text and first is None:
                    first = time.perf_counter() - start
                parts.append(text)
    finally:
        conn.close()
    return {"text": "".join(parts), "ttft_s": first, "latency_s": time.perf_counter() - start}


def snapshot(procs: dict[str, Proc]) -> dict:
    workers = {r: p for r, p in procs.items() if r != "gateway"}
    return {
        "cpu_s": {role: cpu_seconds(p.pid) for role, p in procs.items()},
        "stats": {role: worker_stats(p.address) for role, p in workers.items()},
    }


def run_config(config: str, workload: Workload, model: str, max_tokens: int) -> dict:
    measured: dict[str, Any] = {"load_average_before": os.getloadavg()}
    procs = start(config, model)
    try:
        port = split_url(procs["gateway"].address, "http")[1]
        warm = draw("green", "circle", (48, 48)).png()  # outside the workload's sizes
        warm_url = "data:image/png;base64," + base64.b64encode(warm).decode()
        part = [{"type": "image_url", "image_url": {"url": warm_url}}]
        chat(port, model, [{"role": "user", "content": part}], max_tokens)
        workload.replies.clear()
        measured["before"], began = snapshot(procs), time.perf_counter()
        answers = []
        for request in workload.order:
            answer = chat(port, model, workload.messages(request), max_tokens)
            workload.replies[(request.conversation, request.turn)] = answer["text"]
            answers.append(answer)
        measured["wall_s"] = time.perf_counter() - began
        measured["after"] = snapshot(procs)
    finally:
        stop(procs)
    return summarize(config, workload.order, answers, measured)


def machine() -> dict:
    cpuinfo = Path("/proc/cpuinfo").read_text()
    model = next(
        (ln.split(":", 1)[1].strip() for ln in cpuinfo.splitlines() if "model name" in ln), "?"
    )

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout

    return {
        "cpu": model,
        "cpus": os.cpu_count(),
        "mem_gib": round(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30, 1),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "commit": git("rev-parse", "--short", "HEAD").strip(),
        "uncommitted_src": git("status", "--porcelain", "--", "src").split("\n")[:-1],
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--model", default="tiny-qwen3-vl")
    p.add_argument("--conversations", type=int, default=CONVERSATIONS)
    p.add_argument("--turns", type=int, default=TURNS)
    p.add_argument("--reuse", type=float, default=0.8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--configs", nargs="+", choices=CONFIGS, default=list(CONFIGS))
    args = p.parse_args(argv)
    if "pd" not in args.configs:
        p.error("--configs needs pd: the answers are checked against it")
    began = time.monotonic()
    workload = plan(args.conversations, args.turns, args.seed, args.reuse)
    configs = sorted(args.configs, key=CONFIGS.index)
    rounds: list[dict[str, dict]] = []
    for n in range(args.rounds):
        results = {}
        for config in configs if n % 2 == 0 else configs[::-1]:  # alternate against drift
            results[config] = run_config(config, workload, args.model, args.max_tokens)
            took = results[config]["wall_s"]
            print(f"round {n + 1} {config}: {took:.1f} s", file=sys.stderr, flush=True)
        rounds.append({c: results[c] for c in configs})
    wrong = mismatches(rounds, workload.order)
    encoded = [  # under E/P/D the prefill must run no vision tower
        {"round": n + 1, "config": name, "prefill_vision_encodes": r["prefill_vision_encodes"]}
        for n, results in enumerate(rounds) for name, r in results.items()
        if name != "pd" and r["prefill_vision_encodes"]
    ]  # fmt: skip
    summary = {c: medians([r[c] for r in rounds]) for c in configs}
    report = {
        "machine": machine(),
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "workload": {
            "requests": len(workload.order),
            "distinct_images": len(workload.images),
            "turn_reuse_rate": workload.reuse_rate,
            "images_sent": sum(t.turn + 1 for t in workload.order),
            "image_sizes": [list(i.size) for i in workload.images],
        },
        "median_over_rounds": summary,
        "rounds": rounds,
        "answers_match": not wrong,
        "mismatches": wrong,
        "epd_prefill_encoded": encoded,
        "runtime_s": time.monotonic() - began,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "epd_reuse.json").write_text(json.dumps(report, indent=1) + "\n")
    print(f"Median of {args.rounds} round(s):\n" + table(list(summary.items())))
    print(
        "\nEach round:\n"
        + table([(f"{c} #{n + 1}", r[c]) for n, r in enumerate(rounds) for c in r])
    )
    for problem in [*wrong, *encoded]:
        print(f"FAIL: {json.dumps(problem)}", file=sys.stderr)
    return 1 if wrong or encoded else 0


if __name__ == "__main__":
    sys.exit(main())
