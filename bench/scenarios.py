"""Request bodies of the side-by-side bench, written once to files the load generator reads."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from bench import fresh
from bench.fresh import tagged_b64

MODEL = "tiny-qwen3-vl"
WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "seven",
    "wizards",
    "quietly",
    "box",
]


@dataclass(frozen=True)
class Scenario:
    name: str
    images: int  # images per request
    image_size: tuple[int, int] | None
    prompt_chars: int  # the built-in byte tokenizer: one token per byte
    max_tokens: int
    stream: bool
    modes: tuple[str, ...]  # "agg", "pd"


SCENARIOS = {
    s.name: s
    for s in (
        Scenario("short_text", 0, None, 100, 16, False, ("agg", "pd")),
        Scenario("long_text_stream", 0, None, 3000, 64, True, ("agg", "pd")),
        Scenario("image_1024_stream", 1, (1024, 1024), 40, 16, True, ("agg", "pd")),
        Scenario("images_4x1080p", 4, (1920, 1080), 40, 16, True, ("agg", "pd")),
    )
}

# Bodies of the mixed-load run (docs/benchmarks.md): the text streams whose token timing is
# measured, and the image requests that arrive beside them.
MIXED_TEXT = Scenario("text_stream_64", 0, None, 100, 64, True, ("pd",))
MIXED_IMAGE = SCENARIOS["image_1024_stream"]


def text(chars: int) -> str:
    out, i = [], 0
    while sum(len(w) + 1 for w in out) < chars:
        out.append(WORDS[i % len(WORDS)])
        i += 1
    return " ".join(out)[:chars]


def jpeg_data_url(size: tuple[int, int], seed: int) -> str:
    """A data URL of :func:`jpeg_bytes` with the per-request placeholder (``bench.fresh``)."""
    return "data:image/jpeg;base64," + tagged_b64(jpeg_bytes(size, seed))


def jpeg_bytes(size: tuple[int, int], seed: int) -> bytes:
    """A photo-like JPEG: smooth gradients plus mild noise (random noise would not compress)."""
    w, h = size
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    channels = [
        128 + 100 * np.sin(x / (40 + 10 * c + seed) + y / (70 + 5 * c)) + rng.normal(0, 8, (h, w))
        for c in range(3)
    ]
    pixels = np.clip(np.stack(channels, axis=-1), 0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def fresh_text(chars: int) -> str:
    """``chars`` characters of prompt that open with the per-request placeholder
    (``bench.fresh``): no two requests send the same text, so a cache of prompt tokens
    (Tandem's ``--prompt-cache-tokens``) gains nothing a real first turn would not."""
    tag = fresh.PLACEHOLDER.decode() + " "
    return tag + text(max(chars - len(tag), 0))


def body(scenario: Scenario) -> dict:
    prompt = fresh_text(scenario.prompt_chars)
    if scenario.images:
        assert scenario.image_size is not None
        parts: list[dict] = [
            {"type": "image_url", "image_url": {"url": jpeg_data_url(scenario.image_size, i)}}
            for i in range(scenario.images)
        ]
        content: str | list[dict] = [*parts, {"type": "text", "text": prompt}]
    else:
        content = prompt
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": scenario.max_tokens,
        "stream": scenario.stream,
        "temperature": 0,
    }


def write_body(scenario: Scenario, directory: Path, max_tokens: int | None = None) -> Path:
    data = body(scenario)
    if max_tokens is not None:
        data["max_tokens"] = max_tokens
    path = directory / f"{scenario.name}-{data['max_tokens']}.json"
    path.write_text(json.dumps(data))
    return path
