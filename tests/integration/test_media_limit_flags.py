"""The media fetch limits are operator flags: a real gateway enforces the values it was given.

The limits themselves are tested at the policy level (tests/unit/media); this checks that
the flags reach the gateway's policy end to end, seen through the official openai client.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest
from PIL import Image

from .image_server import noise_png_bytes
from .processes import Proc, start_all

MODEL = "tiny-qwen3-vl"
MAX_PIXELS = 64 * 64
MAX_BYTES = 2048  # --mm-max-media-mb 0.001953125 (2 KiB)


def solid_png(size: tuple[int, int]) -> bytes:
    """A one-colour PNG: a few hundred bytes whatever its size."""
    buffer = io.BytesIO()
    Image.fromarray(np.full((size[1], size[0], 3), 120, dtype=np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


def ask(client: openai.OpenAI, png: bytes) -> str:
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    parts = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "What?"}]
    answer = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": parts}], max_tokens=2
    )
    return answer.choices[0].finish_reason


@pytest.fixture(scope="module", params=["router", "worker"])
def client(request: pytest.FixtureRequest, model_cache: Path) -> Iterator[openai.OpenAI]:
    """The limits on the process that handles the media: the gateway, or the worker."""
    limits = ["--mm-max-media-mb", str(MAX_BYTES / (1 << 20))]
    limits += ["--mm-max-image-pixels", str(MAX_PIXELS), "--mm-fetch-timeout-secs", "5"]
    on_worker = request.param == "worker"
    (worker,) = start_all([["worker", "--model", MODEL, *(limits if on_worker else [])]])
    gateway: Proc | None = None
    try:
        gateway_args = ["gateway", "--port", "0", "--worker-urls", worker.address]
        gateway_args += ["--mm-processing", request.param, *([] if on_worker else limits)]
        (gateway,) = start_all([gateway_args])
        yield openai.OpenAI(base_url=f"{gateway.address}/v1", api_key="unused", max_retries=0)
    finally:
        for proc in (gateway, worker):
            if proc is not None:
                proc.stop()


def test_an_image_within_both_limits_is_served(client: openai.OpenAI) -> None:
    png = solid_png((64, 64))
    assert len(png) <= MAX_BYTES
    assert ask(client, png) in ("length", "stop")


def test_more_pixels_than_the_flag_allows_is_refused(client: openai.OpenAI) -> None:
    png = solid_png((65, 64))
    assert len(png) <= MAX_BYTES  # only the pixel count is over
    with pytest.raises(openai.BadRequestError) as info:
        ask(client, png)
    assert info.value.code == "media_too_large"
    assert str(MAX_PIXELS) in info.value.message


def test_more_bytes_than_the_flag_allows_is_refused(client: openai.OpenAI) -> None:
    png = noise_png_bytes(seed=3, size=(32, 32))  # ≈ 3 KiB, well under the pixel cap
    assert len(png) > MAX_BYTES
    with pytest.raises(openai.BadRequestError) as info:
        ask(client, png)
    assert info.value.code == "media_too_large"
    assert str(MAX_BYTES) in info.value.message
