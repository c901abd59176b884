"""A lean HTTP/1.1 load generator: closed loop at a fixed concurrency, or open loop at a rate.

Run as its own process (the bench pins it with ``taskset``): it reads one JSON spec on the
command line and prints one JSON result. Requests are pre-serialized bytes written to
keep-alive connections; responses are read by Content-Length or chunked framing, so the
generator spends little CPU per request. Latency is request written → last byte read.
Loopback only.

Spec: ``{"port", "path", "body" (file of the JSON body), "mode": "closed"|"open",
"concurrency", "rate", "duration_s", "max_requests", "timeout_s", "max_outstanding"}``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HOST = "127.0.0.1"


@dataclass
class Result:
    latencies: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    sent: int = 0

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1


class Pool:
    def __init__(self, port: int) -> None:
        self.port = port
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def get(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.idle:
            return self.idle.pop()
        return await asyncio.open_connection(HOST, self.port, limit=1 << 22)

    def put(self, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:
        self.idle.append(conn)


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    keep = headers.get("connection", "").lower() != "close"
    if "content-length" in headers:
        return status, await reader.readexactly(int(headers["content-length"])), keep
    if headers.get("transfer-encoding", "").lower() == "chunked":
        parts = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                return status, b"".join(parts), keep
            data = await reader.readexactly(size + 2)
            parts.append(data[:-2])
    return status, await reader.read(), False


async def one(pool: Pool, payload: bytes, stream: bool, result: Result, timeout: float) -> None:
    conn = None
    start = time.perf_counter()
    try:
        conn = await asyncio.wait_for(pool.get(), timeout)
        conn[1].write(payload)
        status, body, keep = await asyncio.wait_for(read_response(conn[0]), timeout)
    except TimeoutError:
        result.error("timeout")
        _close(conn)
        return
    except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
        result.error(type(exc).__name__)
        _close(conn)
        return
    elapsed = time.perf_counter() - start
    if keep:
        pool.put(conn)
    else:
        _close(conn)
    if status != 200:
        result.error(f"http_{status}")
    elif stream and b"[DONE]" not in body[-64:]:
        result.error("stream_incomplete")
    else:
        result.latencies.append(elapsed)


def _close(conn) -> None:
    if conn is not None:
        conn[1].close()


def build_payload(spec: dict) -> tuple[bytes, bool]:
    body = Path(spec["body"]).read_bytes()
    stream = bool(json.loads(body).get("stream"))
    head = (
        f"POST {spec.get('path', '/v1/chat/completions')} HTTP/1.1\r\nHost: {HOST}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body, stream


async def closed(spec: dict, pool: Pool, payload: bytes, stream: bool, result: Result) -> None:
    deadline = time.perf_counter() + spec["duration_s"]
    budget = [spec.get("max_requests", 10**9)]

    async def loop() -> None:
        while time.perf_counter() < deadline and budget[0] > 0:
            budget[0] -= 1
            result.sent += 1
            await one(pool, payload, stream, result, spec["timeout_s"])

    await asyncio.gather(*(loop() for _ in range(spec["concurrency"])))


async def open_loop(spec: dict, pool: Pool, payload: bytes, stream: bool, result: Result) -> None:
    interval = 1.0 / spec["rate"]
    total = min(int(spec["rate"] * spec["duration_s"]), spec.get("max_requests", 10**9))
    cap = spec.get("max_outstanding", 512)
    tasks: set[asyncio.Task] = set()
    start = time.perf_counter()
    for i in range(total):
        delay = start + i * interval - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if len(tasks) >= cap:
            result.error("overload_outstanding_cap")
            continue
        result.sent += 1
        task = asyncio.create_task(one(pool, payload, stream, result, spec["timeout_s"]))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    send_elapsed = time.perf_counter() - start
    result.errors["_send_elapsed_ms"] = int(send_elapsed * 1000)
    if tasks:
        await asyncio.wait(tasks, timeout=spec["timeout_s"] + 1)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main(spec: dict) -> dict:
    payload, stream = build_payload(spec)
    pool, result = Pool(spec["port"]), Result()
    started = time.perf_counter()
    if spec["mode"] == "closed":
        await closed(spec, pool, payload, stream, result)
    else:
        await open_loop(spec, pool, payload, stream, result)
    wall = time.perf_counter() - started
    for _, writer in pool.idle:
        writer.close()
    send_ms = result.errors.pop("_send_elapsed_ms", None)
    ok = len(result.latencies)
    return {
        "mode": spec["mode"],
        "concurrency": spec.get("concurrency"),
        "offered_rate": spec.get("rate"),
        "sent": result.sent,
        "ok": ok,
        "errors": result.errors,
        "error_count": sum(result.errors.values()),
        "wall_s": wall,
        "send_s": send_ms / 1000 if send_ms is not None else None,
        "achieved_rate": ok / wall if wall else 0.0,
        "p50_ms": _ms(percentile(result.latencies, 0.50)),
        "p99_ms": _ms(percentile(result.latencies, 0.99)),
        "mean_ms": _ms(sum(result.latencies) / ok if ok else None),
    }


def _ms(value: float | None) -> float | None:
    return None if value is None else value * 1000


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(json.loads(sys.argv[1])))))
