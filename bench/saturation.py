"""A bounded saturation run: the Tandem gateway over null PD workers, driven past capacity.

Usage: .venv/bin/python -m bench.saturation [--seconds 60] [--rate 600] [--max-outstanding 256]

Open loop at a fixed rate above what the gateway can serve, for a bounded time, loopback
only. Every request must get exactly one answer (200, or 429/503 from admission control):
the report counts requests without an answer (lost), response ids seen twice (duplicated),
and the gateway's RSS every second (flat means admission control bounds memory).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from bench.loadgen import HOST, Pool, read_response
from bench.procs import rss_bytes, start_tandem, start_worker, wait_ready
from tandem.hostport import split_url

BODY = {
    "model": "tiny-qwen3-vl",
    "messages": [{"role": "user", "content": "Saturate me, please. " * 5}],
    "max_tokens": 16,
}


async def drive(port: int, seconds: float, rate: float, cap: int, gateway_pid: int) -> dict:
    body = json.dumps(BODY).encode()
    payload = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {HOST}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    pool, statuses, ids, failures = Pool(port), {}, {}, {}
    outstanding: set[asyncio.Task] = set()
    rss: list[int] = []

    async def one() -> None:
        conn = None
        try:
            conn = await pool.get()
            conn[1].write(payload)
            status, answer, keep = await asyncio.wait_for(read_response(conn[0]), 60)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
            failures[type(exc).__name__] = failures.get(type(exc).__name__, 0) + 1
            if conn is not None:
                conn[1].close()
            return
        (pool.put if keep else (lambda c: c[1].close()))(conn)
        statuses[status] = statuses.get(status, 0) + 1
        if status == 200:
            rid = json.loads(answer)["id"]
            ids[rid] = ids.get(rid, 0) + 1

    sent, skipped, start = 0, 0, time.perf_counter()
    next_rss = start
    while (now := time.perf_counter()) - start < seconds:
        if now >= next_rss:
            rss.append(rss_bytes(gateway_pid))
            next_rss += 1.0
        if len(outstanding) >= cap:
            skipped += 1  # the generator's own bound: counted, never sent
        else:
            task = asyncio.create_task(one())
            outstanding.add(task)
            task.add_done_callback(outstanding.discard)
            sent += 1
        await asyncio.sleep(max(0.0, start + (sent + skipped) / rate - time.perf_counter()))
    await asyncio.gather(*outstanding)
    answered = sum(statuses.values())
    return {
        "sent": sent,
        "not_sent_generator_cap": skipped,
        "answered": answered,
        "lost": sent - answered - sum(failures.values()),
        "transport_failures": failures,
        "statuses": statuses,
        "duplicated_ids": sum(1 for n in ids.values() if n > 1),
        "ok_per_s": statuses.get(200, 0) / seconds,
        "rss_mib_first_10s": max(rss[:10]) / 2**20,
        "rss_mib_last_10s": max(rss[-10:]) / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rate", type=float, default=600.0)
    parser.add_argument("--max-outstanding", type=int, default=256)
    args = parser.parse_args()
    prefill = wait_ready(start_worker("prefill", "1", 0.0, "tiny-qwen3-vl"))
    decode = wait_ready(start_worker("decode", "1", 0.0, "tiny-qwen3-vl"))
    gateway = start_tandem({"prefill": prefill.address, "decode": decode.address}, "0")
    try:
        port = split_url(gateway.address, "http")[1]
        result = asyncio.run(
            drive(port, args.seconds, args.rate, args.max_outstanding, gateway.pid)
        )
    finally:
        for proc in (gateway, decode, prefill):
            proc.stop()
    print(json.dumps({"seconds": args.seconds, "rate": args.rate, **result}, indent=1))


if __name__ == "__main__":
    main()
