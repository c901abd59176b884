"""Time to serve again after a worker restart: issue 38's probe, repeated.

A PD gateway over null workers (they answer canned tokens, no model) with a 1 s health
interval. Each round streams a 64-token answer, SIGKILLs the decode worker one second into
it, notes what the client got (the SSE error's code), starts a decode worker again on the
same port, and sends a short request every 50 ms until one is answered 200. Reported per
round: the client's error code, and the seconds from the new worker's readiness to the first
200 (issue 38's target: within two health intervals). Numbers, not asserted.

    .venv/bin/python -m bench.recovery [--rounds 5] [--interval 1.0]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
import time
from typing import Any

import httpx

from bench.mm_pool_gap import MODEL, start

TOKEN_DELAY_MS = 40  # 64 tokens take 2.6 s: the kill lands mid-stream


def decode_worker(port: int) -> tuple[subprocess.Popen[str], str]:
    return start(
        "worker", "--model", MODEL, "--engine", "null", "--role", "decode",
        "--null-token-delay-ms", str(TOKEN_DELAY_MS), "--port", str(port),
    )  # fmt: skip


def chat(stream: bool, max_tokens: int) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Say something."}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": stream,
    }


async def killed_stream(api: httpx.AsyncClient, decode: subprocess.Popen[str]) -> str:
    """Stream an answer, kill the decode worker 1 s in; the client's error (code: message)."""
    code = "none"
    started = time.monotonic()
    async with api.stream("POST", "/v1/chat/completions", json=chat(True, 64)) as response:
        async for line in response.aiter_lines():
            if time.monotonic() - started > 1.0 and decode.poll() is None:
                decode.send_signal(signal.SIGKILL)
            if line.startswith("data: {") and '"error"' in line:
                error = json.loads(line[6:])["error"]
                code = f"{error.get('code') or 'no code'}: {error.get('message')!r}"
    return code


async def until_served(api: httpx.AsyncClient, timeout_s: float = 60.0) -> float:
    """Seconds until a short request is answered 200 (sent every 50 ms)."""
    began = time.monotonic()
    while time.monotonic() - began < timeout_s:
        response = await api.post("/v1/chat/completions", json=chat(False, 2))
        if response.status_code == 200:
            return time.monotonic() - began
        await asyncio.sleep(0.05)
    return float("inf")


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    prefill, prefill_url = start(
        "worker", "--model", MODEL, "--engine", "null", "--role", "prefill", "--port", "0"
    )
    decode, decode_url = decode_worker(0)
    port = int(decode_url.rsplit(":", 1)[1])
    gateway, gateway_url = start(
        "gateway", "--port", "0", "--pd-disaggregation", "--prefill", prefill_url,
        "--decode", decode_url, "--health-check-interval-secs", str(args.interval),
    )  # fmt: skip
    rounds = []
    try:
        async with httpx.AsyncClient(base_url=gateway_url, timeout=60) as api:
            for _ in range(args.rounds):
                code = await killed_stream(api, decode)
                decode.wait(10)
                await asyncio.sleep(args.down_s)  # the pool notices and the breaker opens
                decode, _ = await asyncio.to_thread(decode_worker, port)
                rounds.append({"client_error": code, "served_after_s": await until_served(api)})
    finally:
        for proc in (gateway, decode, prefill):
            proc.kill()
    return rounds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--interval", type=float, default=1.0, help="--health-check-interval-secs")
    p.add_argument("--down-s", type=float, default=6.0, help="seconds the worker stays down")
    args = p.parse_args()
    rounds = asyncio.run(run(args))
    for i, r in enumerate(rounds):
        print(
            f"round {i}: client error {r['client_error']}, served {r['served_after_s']:.2f} s "
            "after the decode worker was ready"
        )
    worst = max(r["served_after_s"] for r in rounds)
    print(f"worst {worst:.2f} s (target {2 * args.interval:.1f} s)")


if __name__ == "__main__":
    main()
