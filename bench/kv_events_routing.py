"""Routing from the workers' KV events with two gateway replicas (issue 36's acceptance).

Multi-turn image chats (``--turns``, 3 by default; each turn adds one image and re-sends
every earlier one with the real answers) go through one or two Tandem gateways, a
client-side round robin giving each conversation's turns to the gateways in turn (turn t
of conversation c to gateway (c + t) mod G), as a load balancer would. The workers are
real embedded tiny-qwen3-vl workers (aggregated: prefill and decode in one process, which
is what 2 cores carry; ``--workers`` of them). The figure is the prefix-cache hit rate the
workers' own counters give (``tandem.kv.KvTransfer/Stats``: hit tokens over hit + computed
prompt tokens) beside its ceiling (each turn's previous prompt in whole blocks, over all
prompt tokens: what a perfect router could reuse), for:

    1 gateway  kv_events | 2 gateways kv_events | 2 gateways cache_aware | 2 round_robin

Every scenario gets fresh workers and gateways, and images no other scenario sends. The
acceptance: two replicas with ``kv_events`` within 5 % (relative) of one gateway with it.
Gateways use ``--mm-processing router`` (the gateway expands images, so the policy keys
whole prompts; docs/architecture.md). Prints a markdown table and the command; ``--json``
writes the figures.

    .venv/bin/python -m bench.kv_events_routing [--workers 3] [--conversations 12]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import random
import sys
import time
from dataclasses import dataclass, field

import httpx
from PIL import Image, ImageDraw

from bench.measure import worker_stats
from bench.procs import HOST, READY, Proc, spawn, wait_ready

MODEL = "tiny-qwen3-vl"
BLOCK = 16  # the workers' prefix-cache block (Tandem's default)
ALL_CPUS = f"0-{(os.cpu_count() or 1) - 1}"
SCENARIOS = (("kv_events", 1), ("kv_events", 2), ("cache_aware", 2), ("round_robin", 2))


@dataclass
class Outcome:
    policy: str
    gateways: int
    requests: int = 0
    failed: int = 0
    hit_tokens: int = 0
    computed_tokens: int = 0
    per_worker_prompts: list[int] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    prompt_tokens: int = 0  # as the responses' usage counts them
    reusable_tokens: int = 0  # each turn's previous prompt, in whole blocks: the ceiling

    @property
    def hit_rate(self) -> float:
        total = self.hit_tokens + self.computed_tokens
        return self.hit_tokens / total if total else 0.0

    @property
    def ceiling(self) -> float:
        return self.reusable_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def picture(seed: int) -> str:
    """A 112x96 PNG of its own (same size for all: only the image hashes tell them apart)."""
    rng = random.Random(seed)
    img = Image.new("RGB", (112, 96), tuple(rng.randrange(256) for _ in range(3)))
    draw = ImageDraw.Draw(img)
    for _ in range(3):
        x, y = rng.randrange(80), rng.randrange(64)
        draw.rectangle((x, y, x + 30, y + 30), fill=tuple(rng.randrange(256) for _ in range(3)))
    out = io.BytesIO()
    img.save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def chat_body(images: list[str], replies: list[str], turn: int, max_tokens: int) -> dict:
    messages: list[dict] = []
    for t in range(turn + 1):
        parts = [
            {"type": "image_url", "image_url": {"url": images[t]}},
            {"type": "text", "text": f"Turn {t + 1}: what shape is in this picture?"},
        ]
        messages.append({"role": "user", "content": parts})
        if t < turn:
            messages.append({"role": "assistant", "content": replies[t]})
    return {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0}


async def converse(
    http: httpx.AsyncClient,
    gateways: list[str],
    conv: int,
    args: argparse.Namespace,
    seed: int,
    out: Outcome,
) -> None:
    images = [picture(seed * 100_003 + conv * 101 + t) for t in range(args.turns)]
    replies: list[str] = []
    previous = 0  # the last turn's prompt tokens
    for turn in range(args.turns):
        url = gateways[(conv + turn) % len(gateways)] + "/v1/chat/completions"
        started = time.monotonic()
        reply = await http.post(url, json=chat_body(images, replies, turn, args.max_tokens))
        out.latencies.append(time.monotonic() - started)
        out.requests += 1
        if reply.status_code != 200:
            out.failed += 1
            replies.append("I do not know.")
            continue
        answer = reply.json()
        replies.append(answer["choices"][0]["message"]["content"] or "")
        prompt = answer["usage"]["prompt_tokens"]
        out.prompt_tokens += prompt
        # A worker caches whole blocks of a prompt and recomputes the last position.
        out.reusable_tokens += min(previous // BLOCK, (prompt - 1) // BLOCK) * BLOCK
        previous = prompt


async def drive(gateways: list[str], args: argparse.Namespace, seed: int, out: Outcome) -> None:
    pending = list(range(args.conversations))
    timeout = httpx.Timeout(120.0)
    async with httpx.AsyncClient(timeout=timeout) as http:

        async def runner() -> None:
            while pending:
                await converse(http, gateways, pending.pop(0), args, seed, out)

        await asyncio.gather(*(runner() for _ in range(args.concurrency)))


def start_workers(n: int) -> list[Proc]:
    argv = [sys.executable, "-m", "tandem.cli", "worker", "--model", MODEL, "--port", "0"]
    argv += ["--log-level", "warning"]
    procs = [spawn(f"worker-{i}", ALL_CPUS, argv, READY) for i in range(n)]
    return [wait_ready(p) for p in procs]


def start_gateways(n: int, policy: str, workers: list[Proc]) -> list[Proc]:
    argv = [sys.executable, "-m", "tandem.cli", "gateway", "--host", HOST, "--port", "0"]
    argv += ["--policy", policy, "--mm-processing", "router", "--log-level", "warning"]
    argv += ["--worker-urls", *(w.address for w in workers)]
    procs = [spawn(f"gateway-{i}", ALL_CPUS, argv, READY) for i in range(n)]
    return [wait_ready(p) for p in procs]


def run_scenario(policy: str, n_gateways: int, args: argparse.Namespace, seed: int) -> Outcome:
    out = Outcome(policy, n_gateways)
    workers = start_workers(args.workers)
    gateways: list[Proc] = []
    try:
        gateways = start_gateways(n_gateways, policy, workers)
        time.sleep(args.settle_s)  # subscriptions live before the first turn
        before = [worker_stats(w.address) for w in workers]
        started = time.monotonic()
        asyncio.run(drive([g.address for g in gateways], args, seed, out))
        out.wall_s = time.monotonic() - started
        after = [worker_stats(w.address) for w in workers]
        for old, new in zip(before, after, strict=True):
            out.hit_tokens += new["prefix_cache_hit_tokens"] - old["prefix_cache_hit_tokens"]
            out.computed_tokens += new["prefill_computed_tokens"] - old["prefill_computed_tokens"]
            out.per_worker_prompts.append(new["prefix_cache_lookups"] - old["prefix_cache_lookups"])
    finally:
        for proc in [*gateways, *workers]:
            proc.stop()
    return out


def table(outcomes: list[Outcome]) -> str:
    lines = [
        "| gateways | policy | requests (failed) | prefix-cache hit rate | ceiling | hit tokens | "
        "computed tokens | prefills per worker | mean latency | wall |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        mean = sum(o.latencies) / len(o.latencies) if o.latencies else 0.0
        lines.append(
            f"| {o.gateways} | {o.policy} | {o.requests} ({o.failed}) | {o.hit_rate:.1%} | "
            f"{o.ceiling:.1%} | "
            f"{o.hit_tokens} | {o.computed_tokens} | {'/'.join(map(str, o.per_worker_prompts))} "
            f"| {mean * 1000:.0f} ms | {o.wall_s:.1f} s |"
        )
    return "\n".join(lines)


def verdict(outcomes: list[Outcome]) -> tuple[bool, str]:
    one, two = outcomes[0], outcomes[1]
    if one.hit_rate == 0:
        return False, "one gateway with kv_events had no prefix-cache hits: nothing to compare"
    gap = (one.hit_rate - two.hit_rate) / one.hit_rate
    ok = gap <= 0.05 and not one.failed and not two.failed
    return ok, (
        f"two kv_events replicas: {two.hit_rate:.1%} vs one gateway {one.hit_rate:.1%} "
        f"({gap:+.1%} relative shortfall; acceptance <= 5 %): {'PASS' if ok else 'FAIL'}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--conversations", type=int, default=24)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--settle-s", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=int.from_bytes(os.urandom(3), "big"))
    parser.add_argument("--only", choices=[f"{p}x{g}" for p, g in SCENARIOS], action="append")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()
    if args.turns < 2 or args.workers < 2:
        parser.error("--turns and --workers must be >= 2")
    scenarios = [s for s in SCENARIOS if not args.only or f"{s[0]}x{s[1]}" in args.only]
    outcomes = []
    for i, (policy, n) in enumerate(scenarios):
        outcome = run_scenario(policy, n, args, args.seed + i)  # images of its own
        print(f"{n} x {policy}: hit rate {outcome.hit_rate:.1%}", file=sys.stderr, flush=True)
        outcomes.append(outcome)
    print(table(outcomes))
    print()
    print("command: .venv/bin/python -m bench." + " ".join(["kv_events_routing", *sys.argv[1:]]))
    ok = True
    if len(outcomes) >= 2 and outcomes[0].gateways == 1 and outcomes[1].policy == "kv_events":
        ok, line = verdict(outcomes)
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                [o.__dict__ | {"hit_rate": o.hit_rate, "ceiling": o.ceiling} for o in outcomes],
                f,
                indent=1,
            )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
