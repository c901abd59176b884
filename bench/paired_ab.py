"""Two commits' gateways measured at the same moment: CPU per request, A against B.

    .venv/bin/python -m bench.paired_ab --base 3aa133f [--scenario long_text_stream]

On a shared machine whose speed moves by half within minutes (docs/performance.md), two
runs of one figure taken a minute apart differ by more than most changes do. Here both
gateways run at once on ``--gateway-cpus``, fronting the same null workers, and one client
sends them requests in turn (A, B, A, B …, concurrency 1): whatever the machine does, it
does to both. Each round gives both gateways' CPU per request over the same seconds, read
from the scheduler's run time of their threads (``bench.procs.run_time_ms``, to the
microsecond, where ``/proc/<pid>/stat`` counts 10 ms ticks).

A is ``--base``, checked out into a temporary git worktree and run from its ``src`` with
this checkout's virtualenv (so a base that needs other dependencies cannot be measured);
B is the working tree as it is, uncommitted changes included. Every request's prompt is
fresh (``bench.fresh``), as in ``make bench``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import http.client
import json
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from bench import fresh
from bench.procs import HOST, Proc, run_time_ms, start_tandem, start_worker, wait_ready
from bench.scenarios import MODEL, SCENARIOS, write_body
from tandem.hostport import split_url

ROOT = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def worktree(commit: str) -> Iterator[Path]:
    """``commit`` checked out in a temporary worktree, removed afterwards."""
    where = Path(tempfile.mkdtemp(prefix="tandem-ab-")) / "tree"
    git = ["git", "-C", str(ROOT)]
    subprocess.run([*git, "worktree", "add", "--detach", str(where), commit], check=True,
                   capture_output=True)  # fmt: skip
    try:
        yield where
    finally:
        subprocess.run([*git, "worktree", "remove", "--force", str(where)], check=False,
                       capture_output=True)  # fmt: skip


def start_gateway(
    name: str, urls: dict[str, str], cpus: str, src: Path | None, flags: list[str]
) -> Proc:
    """``procs.start_tandem``, run from ``src`` when given (else from this checkout)."""
    saved = os.environ.pop("PYTHONPATH", None)
    if src is not None:
        os.environ["PYTHONPATH"] = str(src)  # ahead of the editable install of this tree
    try:
        return start_tandem(urls, cpus, *flags, name=name)
    finally:
        os.environ.pop("PYTHONPATH", None)
        if saved is not None:
            os.environ["PYTHONPATH"] = saved


class Client:
    """One keep-alive connection per gateway; a request is sent and read to its end."""

    def __init__(self, gateways: dict[str, Proc], body: bytes) -> None:
        self._conns = {
            name: http.client.HTTPConnection(HOST, split_url(gw.address, "http")[1])
            for name, gw in gateways.items()
        }
        self._bodies = fresh.Splicer(body)

    def send(self, name: str) -> None:
        conn = self._conns[name]
        headers = {"Content-Type": "application/json"}
        conn.request("POST", "/v1/chat/completions", self._bodies.next(), headers)
        reply = conn.getresponse()
        data = reply.read()
        if reply.status != 200:
            raise RuntimeError(f"gateway {name} answered {reply.status}: {data[:300]!r}")


def rounds(gateways: dict[str, Proc], client: Client, count: int, seconds: float) -> dict:
    """``count`` rounds of ``seconds`` each: CPU ms per request of every gateway."""
    per_round: dict[str, list[float]] = {name: [] for name in gateways}
    for _ in range(count):
        before = {name: run_time_ms(gw.pid) for name, gw in gateways.items()}
        n, end = 0, time.monotonic() + seconds
        while time.monotonic() < end:
            for name in gateways:
                client.send(name)
            n += 1
        for name, gw in gateways.items():
            per_round[name].append((run_time_ms(gw.pid) - before[name]) / n)
        print("  ".join(f"{k} {v[-1]:.3f}" for k, v in per_round.items()), f"ms/req, n={n}")
    return per_round


def summary(per_round: dict[str, list[float]]) -> dict:
    a, b = statistics.mean(per_round["A"]), statistics.mean(per_round["B"])
    # Paired: each round's B/A, so a round on a slow minute weighs like the others.
    ratios = [y / x for x, y in zip(per_round["A"], per_round["B"], strict=True) if x > 0]
    return {"a_ms": a, "b_ms": b, "change_pct": 100 * (statistics.mean(ratios) - 1),
            "ratio_spread_pct": 100 * (max(ratios) - min(ratios))}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--base", required=True, help="commit of gateway A")
    p.add_argument("--scenario", default="short_text", choices=list(SCENARIOS))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=5.0, help="per round")
    p.add_argument("--max-tokens", type=int)
    p.add_argument("--prompt-chars", type=int)
    p.add_argument("--gateway-cpus", default="0")
    p.add_argument("--load-cpus", default="1")
    p.add_argument("--out", type=Path, help="write the rounds and summary as JSON")
    p.add_argument("--flags", nargs=argparse.REMAINDER, default=[], help="both gateways' flags")
    args = p.parse_args(argv)
    scenario = SCENARIOS[args.scenario]
    if scenario.images:
        p.error("image scenarios are not paired here: use bench.side_by_side")
    if args.max_tokens is not None:
        scenario = dataclasses.replace(scenario, max_tokens=args.max_tokens)
    if args.prompt_chars is not None:
        scenario = dataclasses.replace(scenario, prompt_chars=args.prompt_chars)
    os.sched_setaffinity(0, {int(c) for c in args.load_cpus.split(",")})
    workers = {
        r: wait_ready(start_worker(r, args.load_cpus, 0.0, MODEL)) for r in ("prefill", "decode")
    }
    urls = {r: w.address for r, w in workers.items()}
    gateways: dict[str, Proc] = {}
    try:
        with worktree(args.base) as base, tempfile.TemporaryDirectory() as tmp:
            gateways["A"] = start_gateway("A", urls, args.gateway_cpus, base / "src", args.flags)
            gateways["B"] = start_gateway("B", urls, args.gateway_cpus, None, args.flags)
            client = Client(gateways, write_body(scenario, Path(tmp)).read_bytes())
            for _ in range(40):  # warm up both
                for name in gateways:
                    client.send(name)
            per_round = rounds(gateways, client, args.rounds, args.seconds)
        result = {"base": args.base, "scenario": dataclasses.asdict(scenario),
                  "rounds": per_round, **summary(per_round)}  # fmt: skip
        print(f"A ({args.base}) {result['a_ms']:.3f} ms/req, B (working tree) "
              f"{result['b_ms']:.3f} ms/req: {result['change_pct']:+.1f} % "
              f"(rounds' B/A spread {result['ratio_spread_pct']:.1f} points)")  # fmt: skip
        if args.out:
            args.out.write_text(json.dumps(result, indent=2))
    finally:
        for proc in [*gateways.values(), *workers.values()]:
            proc.stop()


if __name__ == "__main__":
    main()
