"""A 10 s 720p clip through PD: the gateway's CPU per request and the bytes of each leg.

Null workers (``--engine null``: canned tokens at once, no model) behind a PD gateway, so
what is measured is the gateway's own work on a video: the fetch of the ``data:video/mp4``
URL, the container probe, decoding the sampled frames (PyAV), resize and patches on the
router path; on the worker path the prefill worker does that instead. The bytes each leg
carried are read from the workers' leg counters (the decode leg must carry 0 pixel bytes).

    .venv/bin/python -m bench.video_clip [--requests 10] [--seconds 10] [--height 720]

Prints one Markdown table row per media path; numbers, not assertions.
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics
import time

import httpx

from bench.measure import worker_stats
from bench.procs import Proc, cpu_seconds, start_tandem, start_worker, wait_ready
from tandem.engine.builtin_clips import moving_box_clip

MODEL = "tiny-qwen3-vl"


def clip_body(clip: bytes) -> dict:
    url = "data:video/mp4;base64," + base64.b64encode(clip).decode()
    parts = [
        {"type": "video_url", "video_url": {"url": url}},
        {"type": "text", "text": "What happens in this video?"},
    ]
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": parts}],
        "max_tokens": 8,
        "temperature": 0,
    }


def legs(workers: dict[str, Proc]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for role, worker in workers.items():
        for leg, counts in worker_stats(worker.address).get("leg_bytes", {}).items():
            out[f"{role}:{leg}"] = dict(counts)
    return out


def run_path(path: str, body: dict, requests: int, workers: dict[str, Proc]) -> dict:
    urls = {role: w.address for role, w in workers.items()}
    gateway = start_tandem(
        urls, "0-1", "--mm-processing", path, "--no-access-log", name=f"tandem-{path}"
    )
    try:
        with httpx.Client(base_url=gateway.address, timeout=120) as api:
            api.post("/v1/chat/completions", json=body).raise_for_status()  # warm
            before_cpu, before_legs = cpu_seconds(gateway.pid), legs(workers)
            latencies = []
            for _ in range(requests):
                started = time.perf_counter()
                reply = api.post("/v1/chat/completions", json=body)
                reply.raise_for_status()
                latencies.append(time.perf_counter() - started)
            cpu = cpu_seconds(gateway.pid) - before_cpu
            after_legs = legs(workers)
            prompt_tokens = reply.json()["usage"]["prompt_tokens"]
    finally:
        gateway.stop()
    per_leg = {}
    for key, counts in after_legs.items():
        prev = before_legs.get(key, {})
        done = counts["requests"] - prev.get("requests", 0)
        if done > 0:
            per_leg[key] = {
                "message_bytes": (counts["message_bytes"] - prev.get("message_bytes", 0)) / done,
                "pixel_bytes": (counts["pixel_bytes"] - prev.get("pixel_bytes", 0)) / done,
            }
    return {
        "path": path,
        "gateway_cpu_ms_per_request": 1000 * cpu / requests,
        "latency_p50_ms": 1000 * statistics.median(latencies),
        "prompt_tokens": prompt_tokens,
        "legs": per_leg,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--height", type=int, default=720)
    parser.add_argument("--json", action="store_true", help="print the raw figures as JSON")
    args = parser.parse_args()
    size = (args.height * 16 // 9 // 2 * 2, args.height)
    clip = moving_box_clip(args.seconds, size, fps=30)
    body = clip_body(clip)
    workers = {
        role: wait_ready(start_worker(role, "0-1", 0.0, MODEL, media_refs=True))
        for role in ("prefill", "decode")
    }
    try:
        rows = [run_path(path, body, args.requests, workers) for path in ("router", "worker")]
    finally:
        for worker in workers.values():
            worker.stop()
    if args.json:
        print(json.dumps(rows, indent=1))
    print(
        f"clip: {args.seconds:g} s {size[0]}x{size[1]} at 30 fps, {len(clip)} bytes "
        f"(H.264); {args.requests} requests at concurrency 1"
    )
    print("| path | gateway CPU ms/req | p50 ms | prompt tokens | prefill leg bytes (pixels) "
          "| decode leg bytes (pixels) |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for row in rows:
        prefill = next((v for k, v in row["legs"].items() if k.startswith("prefill")), {})
        decode = next((v for k, v in row["legs"].items() if k.startswith("decode")), {})
        print(
            f"| {row['path']} | {row['gateway_cpu_ms_per_request']:.1f} "
            f"| {row['latency_p50_ms']:.1f} | {row['prompt_tokens']} "
            f"| {prefill.get('message_bytes', 0):.0f} ({prefill.get('pixel_bytes', 0):.0f}) "
            f"| {decode.get('message_bytes', 0):.0f} ({decode.get('pixel_bytes', 0):.0f}) |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
