"""Where the gateway's CPU goes: one scenario over null workers, sampled with py-spy.

    .venv/bin/python -m bench.profile_gateway --scenario short_text [--mode pd] [--top 25]

Starts the bench's null workers (on ``--load-cpus``) and one Tandem gateway (on
``--gateway-cpus``), then, with a closed-loop load at ``--concurrency``:

1. measures the gateway's CPU per request without the profiler (the figure to compare
   with ``make bench``);
2. samples the gateway's Python stacks with ``py-spy record --nonblocking`` for the same
   load and prints the functions with the most samples, by self time (the frame on top)
   and by inclusive time (anywhere on the stack). docs/performance.md keeps those tops.

``--max-tokens`` and ``--prompt-chars`` change a scenario's answer and prompt length: two
runs that differ in one of them give the cost of a streamed token or of a prompt byte.

``--scenario multi_turn_chat`` profiles the bench's multi-turn image chat instead
(``bench.chat_mixed.multi_turn``'s conversations, closed loop at ``--concurrency``); give
the ``-best`` settings with ``--flags`` to profile ``tandem-best``.

Samples of threads and processes parked in a blocking read (a pool process waiting for
its next image in ``Connection.recv_bytes``, an idle ``ThreadPoolExecutor`` thread in
``_worker``) are counted by ``--nonblocking`` sampling too, under frames such as
``_send (multiprocessing/connection.py)``: they are not CPU.

py-spy (PyPI, a static binary) is installed into ``~/.cache/tandem/bench/tools-venv`` on
first use, never into .venv.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import measure
from bench.chat_mixed import chat_conf, write_jpegs
from bench.procs import BENCH_HOME, cpu_seconds, start_tandem, start_worker, wait_ready
from bench.scenarios import MODEL, SCENARIOS, write_body
from tandem.hostport import split_url

TOOLS_VENV = BENCH_HOME / "tools-venv"
CHAT = "multi_turn_chat"
PY_SPY_VERSION = "0.4.1"


def ensure_py_spy() -> Path:
    binary = TOOLS_VENV / "bin" / "py-spy"
    if not binary.exists():
        subprocess.run([sys.executable, "-m", "venv", str(TOOLS_VENV)], check=True)
        pip = [str(TOOLS_VENV / "bin" / "python"), "-m", "pip", "install", "--quiet"]
        subprocess.run([*pip, f"py-spy=={PY_SPY_VERSION}"], check=True, timeout=600)
    return binary


def frame_name(frame: str) -> str:
    """``func (path/to/file.py:12)`` → ``func (file.py)``: one row per function, not line."""
    func, _, where = frame.partition(" (")
    path = where.rsplit(":", 1)[0]
    parts = Path(path).parts
    short = "/".join(parts[-2:]) if len(parts) >= 2 else path
    return f"{func} ({short})"


def tops(raw: Path) -> tuple[collections.Counter, collections.Counter, int]:
    """Self and inclusive sample counts per function from py-spy's collapsed stacks."""
    own: collections.Counter = collections.Counter()
    inclusive: collections.Counter = collections.Counter()
    total = 0
    # One record per stack, each opening with `process PID:"cmdline"` (--subprocesses); a
    # record may span lines, as py-spy names some frames by a docstring that has newlines.
    for record in re.split(r"\n(?=process \d+:)", raw.read_text(errors="replace")):
        stack, _, count_text = record.strip().rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [frame_name(f) for f in stack.replace("\n", " ").split(";")[1:]]
        if not frames:
            continue
        own[frames[-1]] += count  # the frame on top is the last one
        for name in set(frames):
            inclusive[name] += count
        total += count
    return own, inclusive, total


def print_top(title: str, counts: collections.Counter, total: int, n: int) -> None:
    print(f"\n{title} (share of {total} samples)")
    for name, count in counts.most_common(n):
        print(f"{100 * count / total:6.1f}%  {name}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--scenario", default="short_text", choices=[*SCENARIOS, CHAT])
    p.add_argument("--mode", default="pd", choices=["pd", "agg"])
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--rate", type=int, default=499, help="py-spy samples per second")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--max-tokens", type=int, help="override the scenario's max_tokens")
    p.add_argument("--prompt-chars", type=int, help="override the scenario's prompt length")
    p.add_argument("--gateway-cpus", default="0")
    p.add_argument("--load-cpus", default="1")
    p.add_argument("--raw-out", type=Path, default=Path("/tmp/tandem-profile.txt"))
    p.add_argument("--flags", nargs=argparse.REMAINDER, default=[], help="gateway flags")
    args = p.parse_args(argv)
    py_spy = ensure_py_spy()
    roles = ("prefill", "decode") if args.mode == "pd" else ("both",)
    workers = {r: wait_ready(start_worker(r, args.load_cpus, 0.0, MODEL)) for r in roles}
    gateway = start_tandem(
        {r: w.address for r, w in workers.items()}, args.gateway_cpus, *args.flags
    )
    try:
        with tempfile.TemporaryDirectory(prefix="tandem-profile-") as tmp:
            body, load = _load(args, Path(tmp))
            port = split_url(gateway.address, "http")[1]
            measure.loadgen(args.load_cpus, port, body, **load, duration_s=2.0)  # warm up
            before = cpu_seconds(gateway.pid)
            plain = measure.loadgen(args.load_cpus, port, body, **load, duration_s=args.seconds)
            used = cpu_seconds(gateway.pid) - before
            n = max(plain["ok"], 1)
            print(
                f"{args.scenario} {args.mode}: {plain['ok']} ok, {plain['error_count']} errors, "
                f"{plain['achieved_rate']:.0f} req/s, gateway CPU {1000 * used / n:.2f} ms/req"
            )
            raw = args.raw_out
            spy = subprocess.Popen(
                [str(py_spy), "record", "--pid", str(gateway.pid), "--nonblocking",
                 "--rate", str(args.rate), "--format", "raw", "--output", str(raw),
                 "--duration", str(int(args.seconds)), "--subprocesses"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            measure.loadgen(args.load_cpus, port, body, **load, duration_s=args.seconds)
            spy.wait(timeout=args.seconds + 60)
            own, inclusive, total = tops(raw)
            print_top("self", own, total, args.top)
            print_top("inclusive", inclusive, total, args.top)
    finally:
        gateway.stop()
        for w in workers.values():
            w.stop()


def _load(args: argparse.Namespace, tmp: Path) -> tuple[Path | None, dict]:
    """The body file and the load generator's spec of the scenario."""
    if args.scenario != CHAT:
        scenario = SCENARIOS[args.scenario]
        if args.max_tokens is not None:
            scenario = dataclasses.replace(scenario, max_tokens=args.max_tokens)
        if args.prompt_chars is not None:
            scenario = dataclasses.replace(scenario, prompt_chars=args.prompt_chars)
        return write_body(scenario, tmp), {
            "mode": "closed",
            "concurrency": args.concurrency,
        }
    chat = chat_conf(write_jpegs(tmp, 8, (1024, 1024)))
    return None, {"mode": "chat", "concurrency": args.concurrency, "chat": chat, "timeout_s": 30.0}


if __name__ == "__main__":
    main()
