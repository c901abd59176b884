"""Event-loop stalls under large inputs: the longest gap between a text stream's tokens.

A null worker (it answers canned tokens, no model) streams 64 tokens at a fixed pace
(``--null-token-delay-ms``); a gateway relays them while other clients send large inputs:
2 MiB chat prompts, 2 MiB ``/tokenize`` bodies, 15 MiB ``json_schema`` response formats, and
2 MiB of tool-call arguments. Anything that holds the gateway's GIL (tokenizing, parsing,
schema checks) shows as a gap in the stream. Each load kind runs alone, then all mixed; the
stream's p50, p99 and longest inter-token gap are reported (issue 30's target: the longest
under 50 ms), the longest wait for a stream's first token (a stall can fall there too), and
the load requests done with their status codes. Numbers, not asserted.

    .venv/bin/python -m bench.loop_stall [--seconds 8] [--clients 4] [--kinds prompt schema]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import multiprocessing
import time
from typing import Any

import httpx
import numpy as np

from bench.mm_pool_gap import MODEL, start

MiB = 1 << 20
STREAM_TOKENS = 64


def _prose(size: int) -> str:
    words = "the quick brown fox jumps over a lazy dog while seven tired owls watch "
    return (words * (size // len(words) + 1))[:size]


def _schema(size: int) -> dict[str, Any]:
    """An object schema of many small properties: what makes a schema costly to check."""
    one = {"type": "string", "description": "a property of the answer"}
    count = size // (len(json.dumps(one)) + 12)
    return {"type": "object", "properties": {f"p{i}": one for i in range(count)}}


def _user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def bodies() -> dict[str, tuple[str, dict[str, Any]]]:
    """Each load kind: (path, body)."""
    text = _prose(2 * MiB)
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": text}}
    chat = {"model": MODEL, "max_tokens": 1}
    return {
        "prompt": (
            "/v1/chat/completions",
            {**chat, "messages": [{"role": "user", "content": text}]},
        ),
        "tokenize": ("/tokenize", {"model": MODEL, "prompt": text}),
        "schema": (
            "/v1/chat/completions",
            {
                **chat,
                "messages": [{"role": "user", "content": "hi"}],
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "big", "schema": _schema(15 * MiB)},
                },
            },
        ),
        "tool-args": (
            "/v1/chat/completions",
            {
                **chat,
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": None, "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "ok"},
                ],
            },
        ),
    }


async def stream_once(
    api: httpx.AsyncClient, gaps: list[float], firsts: list[float] | None = None
) -> None:
    """One stream; ``gaps`` gets its inter-token gaps, ``firsts`` its wait for the first."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Say something."}],
        "max_tokens": STREAM_TOKENS,
        "stream": True,
    }
    sent = time.perf_counter()
    async with api.stream("POST", "/v1/chat/completions", json=body) as response:
        last = None
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            now = time.perf_counter()
            if last is not None:
                gaps.append(now - last)
            elif firsts is not None:
                firsts.append(now - sent)
            last = now


async def load(
    api: httpx.AsyncClient, kinds: list[tuple[str, bytes]], stop: float, codes: collections.Counter
) -> None:
    i = 0
    while time.perf_counter() < stop:
        path, raw = kinds[i % len(kinds)]
        response = await api.post(path, content=raw, headers={"content-type": "application/json"})
        codes[f"{path} {response.status_code}"] += 1
        i += 1


def _load_process(
    address: str, seconds: float, clients: int, kinds: list[tuple[str, bytes]], out: Any
) -> None:
    """The load clients, in a process of their own: reading 8 MB answers must not delay
    the measuring client's own reads."""

    async def run() -> dict[str, int]:
        codes: collections.Counter = collections.Counter()
        stop = time.perf_counter() + seconds
        async with httpx.AsyncClient(base_url=address, timeout=300) as api:
            await asyncio.gather(
                *(load(api, kinds[c:] + kinds[:c], stop, codes) for c in range(clients))
            )
        return dict(codes)

    out.put(asyncio.run(run()))


async def measure(
    address: str, seconds: float, clients: int, kinds: list[tuple[str, bytes]]
) -> dict[str, Any]:
    gaps: list[float] = []
    firsts: list[float] = []
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    loader = context.Process(target=_load_process, args=(address, seconds, clients, kinds, out))
    async with httpx.AsyncClient(base_url=address, timeout=300) as api:
        await stream_once(api, [])  # warm
        loader.start()
        await asyncio.sleep(0.5)  # the load under way before measuring
        stop = time.perf_counter() + seconds - 0.5
        while time.perf_counter() < stop:
            await stream_once(api, gaps, firsts)
    codes = out.get(timeout=600)
    loader.join(60)
    ms = np.array(gaps) * 1000.0
    return {
        "p50": float(np.percentile(ms, 50)),
        "p99": float(np.percentile(ms, 99)),
        "max": float(ms.max()),
        "first_max": 1000.0 * max(firsts),
        "streams": len(firsts),
        "codes": codes,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--token-delay-ms", type=float, default=5.0)
    parser.add_argument("--kinds", nargs="+", default=[*bodies(), "mixed"])
    args = parser.parse_args()
    encoded = {name: (path, json.dumps(body).encode()) for name, (path, body) in bodies().items()}
    worker, worker_address = start(
        "worker", "--model", MODEL, "--engine", "null",
        "--null-token-delay-ms", str(args.token_delay_ms),
    )  # fmt: skip
    gateway, address = start(
        "gateway", "--port", "0", "--worker-urls", worker_address,
        "--no-access-log", "--log-level", "warning",
    )  # fmt: skip
    try:
        sizes = ", ".join(f"{n} {len(raw) / MiB:.1f} MiB" for n, (_, raw) in encoded.items())
        print(f"load bodies: {sizes}; {args.clients} clients; stream of {STREAM_TOKENS} tokens")
        print(
            "| load | gap p50 ms | gap p99 ms | longest gap ms | longest wait for a first "
            "token ms | streams | load answers |"
        )
        print("|---|---|---|---|---|---|---|")
        for kind in args.kinds:
            chosen = list(encoded.values()) if kind == "mixed" else [encoded[kind]]
            row = asyncio.run(measure(address, args.seconds, args.clients, chosen))
            answers = ", ".join(f"{k}: {v}" for k, v in sorted(row["codes"].items()))
            print(
                f"| {kind} | {row['p50']:.1f} | {row['p99']:.1f} | {row['max']:.1f} "
                f"| {row['first_max']:.1f} | {row['streams']} | {answers} |"
            )
    finally:
        for proc in (gateway, worker):
            proc.terminate()
            proc.wait(30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
