"""A lean HTTP/1.1 load generator: closed loop at a fixed concurrency, or open loop at a rate.

Run as its own process (the bench pins it with ``taskset``): it reads one JSON spec on the
command line and prints one JSON result. Requests are pre-serialized bytes written to
keep-alive connections; responses are read by Content-Length or chunked framing, so the
generator spends little CPU per request. Latency is request written → last byte read.
Loopback only.

Spec: ``{"port", "path", "body" (file of the JSON body), "mode": "closed"|"open"|"chat",
"concurrency", "rate", "duration_s", "max_requests", "timeout_s", "max_outstanding",
"sse_timing", "chat"}``.

Every image placeholder in a body (``bench.fresh``) is replaced per request, so no two
requests send the same image bytes. ``sse_timing`` times the content events of streamed
answers (``bench.stream_timing``). Mode ``chat`` runs multi-turn image conversations
(``bench.chat_turns``) in a closed loop; ``chat`` is ``{"jpegs": [files], "turns", "seed",
"model", "max_tokens", "prompt"}``. Run it as ``python -m bench.loadgen SPEC`` from the
repository root.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench import chat_turns, fresh, stream_timing
from bench.loadgen_stats import percentile

HOST = "127.0.0.1"


@dataclass
class Result:
    latencies: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    sent: int = 0
    streams: list[dict] = field(default_factory=list)  # filled when timing SSE events

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


async def read_response(
    reader: asyncio.StreamReader, chunks: list[tuple[float, bytes]] | None = None
) -> tuple[int, bytes, bool]:
    """Status, body and keep-alive of one response; ``chunks`` gets (arrival, data) pairs."""
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
            if chunks is not None:
                chunks.append((time.perf_counter(), data[:-2]))
    return status, await reader.read(), False


async def one(
    pool: Pool,
    payload: bytes,
    stream: bool,
    result: Result,
    timeout: float,
    timing: bool = False,
) -> bytes | None:
    """One request; its body when it succeeded, else None (the error is counted)."""
    conn = None
    chunks: list[tuple[float, bytes]] | None = [] if timing and stream else None
    start = time.perf_counter()
    try:
        conn = await asyncio.wait_for(pool.get(), timeout)
        conn[1].write(payload)
        status, body, keep = await asyncio.wait_for(read_response(conn[0], chunks), timeout)
    except TimeoutError:
        result.error("timeout")
        _close(conn)
        return None
    except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
        result.error(type(exc).__name__)
        _close(conn)
        return None
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
        if chunks is not None:
            figures = stream_timing.stream_figures(start, stream_timing.content_times(chunks))
            result.streams.append(figures)
        return body
    return None


def _close(conn) -> None:
    if conn is not None:
        conn[1].close()


def request_bytes(body: bytes, path: str = "/v1/chat/completions") -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {HOST}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def build_payload(spec: dict) -> tuple[fresh.Splicer, bool]:
    """Payloads whose image placeholders get a new tag per request, and whether it streams."""
    body = Path(spec["body"]).read_bytes()
    stream = bool(json.loads(body).get("stream"))
    path = spec.get("path", "/v1/chat/completions")
    return fresh.Splicer(request_bytes(body, path)), stream


async def closed(
    spec: dict, pool: Pool, payloads: fresh.Splicer, stream: bool, result: Result
) -> None:
    deadline = time.perf_counter() + spec["duration_s"]
    budget = [spec.get("max_requests", 10**9)]
    timing = bool(spec.get("sse_timing"))

    async def loop() -> None:
        while time.perf_counter() < deadline and budget[0] > 0:
            budget[0] -= 1
            result.sent += 1
            await one(pool, payloads.next(), stream, result, spec["timeout_s"], timing)

    await asyncio.gather(*(loop() for _ in range(spec["concurrency"])))


async def chat(spec: dict, pool: Pool, result: Result) -> None:
    """Closed loop of multi-turn conversations: each worker runs one conversation's turns in
    order (a turn waits for the previous answer), then starts the next conversation."""
    conf = spec["chat"]
    rests = [fresh.rest_b64(Path(p).read_bytes()) for p in conf["jpegs"]]
    nonce = fresh.new_nonce()
    deadline = time.perf_counter() + spec["duration_s"]
    next_conv = [0]
    result.errors["_conversations"] = 0

    async def loop() -> None:
        while time.perf_counter() < deadline:
            conv = chat_turns.plan(next_conv[0], conf.get("turns", 3), conf.get("seed", 0))
            next_conv[0] += 1
            for turn in range(conv.turns):
                if time.perf_counter() >= deadline:
                    return
                payload = request_bytes(chat_turns.body(conv, turn, rests, nonce, conf))
                result.sent += 1
                answer = await one(pool, payload, False, result, spec["timeout_s"])
                if answer is None:
                    break  # the history would be wrong; start a new conversation
                conv.replies.append(chat_turns.reply_text(answer))
            else:
                result.errors["_conversations"] += 1

    await asyncio.gather(*(loop() for _ in range(spec["concurrency"])))


async def open_loop(
    spec: dict, pool: Pool, payloads: fresh.Splicer, stream: bool, result: Result
) -> None:
    interval = 1.0 / spec["rate"]
    total = min(int(spec["rate"] * spec["duration_s"]), spec.get("max_requests", 10**9))
    cap = spec.get("max_outstanding", 512)
    timing = bool(spec.get("sse_timing"))
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
        task = asyncio.create_task(
            one(pool, payloads.next(), stream, result, spec["timeout_s"], timing)
        )
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    send_elapsed = time.perf_counter() - start
    result.errors["_send_elapsed_ms"] = int(send_elapsed * 1000)
    if tasks:
        await asyncio.wait(tasks, timeout=spec["timeout_s"] + 1)


async def main(spec: dict) -> dict:
    pool, result = Pool(spec["port"]), Result()
    started = time.perf_counter()
    if spec["mode"] == "chat":
        await chat(spec, pool, result)
    else:
        payloads, stream = build_payload(spec)
        if spec["mode"] == "closed":
            await closed(spec, pool, payloads, stream, result)
        else:
            await open_loop(spec, pool, payloads, stream, result)
    wall = time.perf_counter() - started
    for _, writer in pool.idle:
        writer.close()
    send_ms = result.errors.pop("_send_elapsed_ms", None)
    conversations = result.errors.pop("_conversations", None)
    ok = len(result.latencies)
    extra: dict = {}
    if spec.get("sse_timing"):
        extra["stream_timing"] = stream_timing.summarise(result.streams)
    if conversations is not None:
        extra["conversations_completed"] = conversations
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
        **extra,
    }


def _ms(value: float | None) -> float | None:
    return None if value is None else value * 1000


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(json.loads(sys.argv[1])))))
