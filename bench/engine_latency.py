"""Prefill and per-token decode latency of the built-in tiny models on this machine.

Usage: .venv/bin/python bench/engine_latency.py [--threads 1] [--repeats 20]
Prints one Markdown table row per model (a figure for docs, not a test).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from PIL import Image

from tandem.engine.builtin import resolve_model
from tandem.engine.runner import ModelRunner
from tandem.engine.types import MediaInputs, MediaItem
from tandem.models.chat import render_chat
from tandem.models.info import load_model_info
from tandem.models.placeholders import expand_placeholders
from tandem.models.processor import load_processor


def one_image_prompt(model_dir, seed: int = 0):
    info = load_model_info(model_dir)
    rng = np.random.default_rng(seed)
    image = Image.fromarray(rng.integers(0, 256, (480, 640, 3), dtype=np.uint8))
    pre = load_processor(model_dir).preprocess([image])
    parts = [{"type": "image_url", "image_url": {"url": "x"}}, {"type": "text", "text": "Hi?"}]
    text = render_chat(model_dir, [{"role": "user", "content": parts}])
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(model_dir / "tokenizer.json")).encode(text).ids
    expanded, ranges = expand_placeholders(
        ids, info.anchor_token_id, pre.tokens_per_image, info.image_token_id
    )
    items = [MediaItem("h", off, n) for off, n in ranges]
    media = MediaInputs(items, info.image_token_id, pre.pixel_values, dict(pre.grids))
    return expanded, media


def measure(name: str, repeats: int) -> tuple[int, float, float]:
    model_dir = resolve_model(name)
    runner = ModelRunner.load(model_dir, model_id=name)
    ids, media = one_image_prompt(model_dir)
    runner.prefill(ids, media)  # warm-up
    prefill = []
    for _ in range(repeats):
        start = time.perf_counter()
        _, state = runner.prefill(ids, media)
        prefill.append(time.perf_counter() - start)
    steps = []
    token = 1
    for _ in range(repeats * 4):
        start = time.perf_counter()
        runner.decode_step(state, token)
        steps.append(time.perf_counter() - start)
    return len(ids), statistics.median(prefill) * 1e3, statistics.median(steps) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s)")
    print("| model | prompt tokens (one 640×480 image) | prefill p50 | decode p50 per token |")
    print("|---|---|---|---|")
    for name in ("tiny-qwen3-vl", "tiny-llava-1.5"):
        tokens, prefill_ms, decode_ms = measure(name, args.repeats)
        print(f"| {name} | {tokens} | {prefill_ms:.1f} ms | {decode_ms:.2f} ms |")


if __name__ == "__main__":
    main()
