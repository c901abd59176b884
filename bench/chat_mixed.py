"""Two scenarios beside the sweep (docs/benchmarks.md): a multi-turn image chat and a mixed
load of text streams and image requests, each against every gateway variant in turn."""

from __future__ import annotations

import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench import measure
from bench.procs import Proc, cpu_seconds, http_get
from bench.scenarios import MIXED_IMAGE, MIXED_TEXT, MODEL, jpeg_bytes, write_body
from tandem.hostport import split_url


def write_jpegs(directory: Path, count: int, size: tuple[int, int]) -> list[str]:
    """``count`` distinct photo-like base JPEGs (each conversation's copies are made
    byte-distinct by ``bench.fresh``)."""
    paths = []
    for seed in range(count):
        path = directory / f"chat-{size[0]}x{size[1]}-{seed}.jpg"
        if not path.exists():
            path.write_bytes(jpeg_bytes(size, 100 + seed))
        paths.append(str(path))
    return paths


def _cache_lines(gateway: Proc) -> list[str]:
    """Tandem's pixel-cache metric lines, when its /metrics has any (a record, not a figure)."""
    if not gateway.name.startswith("tandem"):
        return []
    try:
        text = http_get(f"{gateway.address}/metrics")
    except OSError:
        return []
    return [
        ln
        for ln in text.splitlines()
        if "pixel_cache" in ln and "_created" not in ln and not ln.startswith("#")
    ]


def chat_conf(jpegs: list[str]) -> dict:
    """The load generator's ``chat`` spec of the bench's 3-turn conversations."""
    conf = {"jpegs": jpegs, "turns": 3, "seed": 7, "model": MODEL, "max_tokens": 16}
    conf["prompt"] = "what changed since the last picture?"
    return conf


def multi_turn(gateway: Proc, jpegs: list[str], cpus: str, args) -> dict:
    """Closed loop of 3-turn conversations at ``args.chat_concurrency``: req/s and gateway
    CPU per request (every turn is one request)."""
    port = split_url(gateway.address, "http")[1]
    conf = chat_conf(jpegs)
    before = cpu_seconds(gateway.pid)
    result = measure.loadgen(
        cpus,
        port,
        None,
        mode="chat",
        concurrency=args.chat_concurrency,
        duration_s=args.chat_seconds,
        chat=conf,
        timeout_s=30.0,
    )
    n = max(result["ok"] + result["error_count"], 1)
    result["gw_cpu_ms_per_req"] = 1000 * (cpu_seconds(gateway.pid) - before) / n
    result["cache_metrics"] = _cache_lines(gateway)
    return result


def mixed(gateway: Proc, bodies: Path, cpus: str, args) -> dict:
    """Text streams at ``args.mixed_text_rate`` alone, then with image requests arriving at
    ``args.mixed_image_rate``: TPOT of the text streams in both phases."""
    port = split_url(gateway.address, "http")[1]
    text = write_body(MIXED_TEXT, bodies)
    image = write_body(MIXED_IMAGE, bodies)
    seconds = args.mixed_seconds
    spec = {"mode": "open", "rate": args.mixed_text_rate, "duration_s": seconds}
    before = cpu_seconds(gateway.pid)
    alone = measure.loadgen(cpus, port, text, sse_timing=True, **spec)
    mid = cpu_seconds(gateway.pid)
    # The image load starts first and outlasts the text phase, so every text stream of the
    # second phase overlaps image work.
    lead = min(1.0, seconds / 4)
    img_argv, img_limit = measure.loadgen_argv(
        cpus, port, image, mode="open", rate=args.mixed_image_rate, duration_s=seconds + 2 * lead
    )
    with ThreadPoolExecutor(1) as pool:
        img_future = pool.submit(
            subprocess.run,
            img_argv,
            capture_output=True,
            text=True,
            timeout=img_limit,
            check=True,
            cwd=measure.ROOT,
        )
        time.sleep(lead)
        loaded = measure.loadgen(cpus, port, text, sse_timing=True, **spec)
        images = json.loads(img_future.result().stdout)
    after = cpu_seconds(gateway.pid)
    return {
        "text_alone": alone,
        "text_with_images": loaded,
        "images": images,
        "gw_cpu_s": {"alone": mid - before, "with_images": after - mid},
        "rates": {"text": args.mixed_text_rate, "image": args.mixed_image_rate},
    }
