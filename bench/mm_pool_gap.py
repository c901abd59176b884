"""Token relaying under image load: the gaps between SSE chunks of text streams.

A null worker streams canned tokens at a fixed pace (``--null-token-delay-ms``); a gateway
relays them while other clients send 1024x1024 JPEG requests (fresh noise each time, so
nothing is cached) on the router path. The gaps between a text stream's chunks show how
long relaying waited: with ``--mm-workers 0`` the decode and preprocess thread shares the
gateway's GIL; with a pool it runs in other processes. Reported as numbers (p50, p99,
max gap in ms, and the image requests done), not asserted.

    .venv/bin/python bench/mm_pool_gap.py [--seconds 10] [--workers 0 2]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import re
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
from PIL import Image

MODEL = "tiny-qwen3-vl"
READY = re.compile(r"TANDEM_(?:WORKER|GATEWAY)_READY (\S+)")


def start(*args: str) -> tuple[subprocess.Popen[str], str]:
    popen = subprocess.Popen(
        [sys.executable, "-m", "tandem.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert popen.stdout is not None
    for line in popen.stdout:
        match = READY.search(line)
        if match:
            # Keep draining the output so that the child never blocks on a full pipe.
            threading.Thread(target=lambda: [None for _ in popen.stdout or []], daemon=True).start()
            return popen, match.group(1)
    raise RuntimeError(f"{args[0]} did not start")


def jpeg_url(seed: int, side: int = 1024) -> str:
    pixels = np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=85)
    return "data:image/jpeg;base64," + base64.b64encode(out.getvalue()).decode()


async def text_stream(api: httpx.AsyncClient, gaps: list[float]) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Say something."}],
        "max_tokens": 128,
        "stream": True,
    }
    async with api.stream("POST", "/v1/chat/completions", json=body) as response:
        last = None
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            now = time.perf_counter()
            if last is not None:
                gaps.append(now - last)
            last = now


async def image_load(api: httpx.AsyncClient, urls: list[str], stop: float, done: list[int]) -> None:
    i = 0
    while time.perf_counter() < stop:
        content = [{"type": "image_url", "image_url": {"url": urls[i % len(urls)]}}]
        content.append({"type": "text", "text": "What is this?"})
        body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 1}
        response = await api.post("/v1/chat/completions", json=body)
        response.raise_for_status()
        done.append(1)
        i += 1


async def measure(address: str, seconds: float, images: int, urls: list[str]) -> dict[str, float]:
    gaps: list[float] = []
    done: list[int] = []
    async with httpx.AsyncClient(base_url=address, timeout=120) as api:
        await text_stream(api, [])  # warm
        stop = time.perf_counter() + seconds
        loaders = [asyncio.create_task(image_load(api, urls, stop, done)) for _ in range(images)]
        while time.perf_counter() < stop:
            await asyncio.gather(*(text_stream(api, gaps) for _ in range(4)))
        await asyncio.gather(*loaders)
    ms = np.array(gaps) * 1000.0
    return {
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "max_ms": float(ms.max()),
        "image_requests": float(len(done)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--image-clients", type=int, default=4)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--token-delay-ms", type=float, default=2.0)
    args = parser.parse_args()
    urls = [jpeg_url(seed) for seed in range(64)]  # distinct images; the cache is off anyway
    worker, worker_address = start(
        "worker", "--model", MODEL, "--engine", "null",
        "--null-token-delay-ms", str(args.token_delay_ms),
    )  # fmt: skip
    try:
        print("| --mm-workers | gap p50 ms | gap p99 ms | gap max ms | image requests |")
        print("|---|---|---|---|---|")
        for n in args.workers:
            gateway, address = start(
                "gateway", "--port", "0", "--worker-urls", worker_address,
                "--mm-processing", "router", "--mm-workers", str(n), "--mm-pixel-cache-mb", "0",
                "--no-access-log", "--log-level", "warning",
            )  # fmt: skip
            try:
                row = asyncio.run(measure(address, args.seconds, args.image_clients, urls))
            finally:
                gateway.terminate()
                gateway.wait(30)
            print(
                f"| {n} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} | {row['max_ms']:.2f} "
                f"| {row['image_requests']:.0f} |"
            )
    finally:
        worker.terminate()
        worker.wait(30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
