"""The image pool and the pixel cache through real gateways and real (tiny, torch) workers.

Each built-in model behind its own gateway with ``--mm-workers 2 --mm-pixel-cache-mb 64``
on the router path. The same chat is sent twice: the second time both images hit the
cache, and the worker must see the same prompt (usage.prompt_tokens) and give the same
greedy answer with the same logprobs, to float rounding, as for the first. A multi-turn
follow-up hits on the image it re-sends and on every earlier image the history re-sends.
No pixel segment is left in /dev/shm, and the pool processes run torch-free.
"""

from __future__ import annotations

import base64
import io
import os
from collections.abc import Iterator

import numpy as np
import openai
import pytest
from PIL import Image

from tandem.gateway.multimodal.pixel_segments import PREFIX, segment_dir

from .gateway_probe import metric
from .processes import SINGLE_PROCESS, Proc, start_all

MODELS = ("tiny-qwen3-vl", "tiny-llava-1.5")


def png_url(size: tuple[int, int], seed: int) -> str:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


FIRST, SECOND, THIRD = png_url((64, 48), 1), png_url((48, 64), 2), png_url((56, 56), 3)


def segments() -> set[str]:
    return {name for name in os.listdir(segment_dir()) if name.startswith(PREFIX)}


@pytest.fixture(scope="module")
def gateways(model_cache: object) -> Iterator[dict[str, Proc]]:
    workers = start_all([["worker", "--model", m] for m in MODELS])
    try:
        gateways = start_all(
            [
                [
                    "gateway",
                    "--port",
                    "0",
                    "--worker-urls",
                    w.address,
                    "--mm-processing",
                    "router",
                    "--mm-workers",
                    "2",
                    "--mm-pixel-cache-mb",
                    "64",
                    "--health-check-interval-secs",
                    "600",
                    # single_process: the hits are counted across requests, and each
                    # process's pixel cache holds only the images its own connections sent
                    # (docs/operations.md, "Several gateway processes").
                    *SINGLE_PROCESS,
                ]
                for w in workers
            ]
        )
        try:
            yield dict(zip(MODELS, gateways, strict=True))
        finally:
            for gateway in gateways:
                gateway.stop()
    finally:
        for worker in workers:
            worker.stop()


def turn(*urls: str, text: str = "Describe the pictures.") -> dict:
    parts: list[dict] = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return {"role": "user", "content": [*parts, {"type": "text", "text": text}]}


async def ask(gateway: Proc, model: str, messages: list[dict]) -> tuple[str, int, list[float]]:
    async with openai.AsyncOpenAI(
        base_url=f"{gateway.address}/v1", api_key="unused", max_retries=0, timeout=120
    ) as api:
        answer = await api.chat.completions.create(
            model=model,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=6,
            temperature=0,
            logprobs=True,
        )
    choice = answer.choices[0]
    assert answer.usage is not None and choice.logprobs is not None
    logprobs = [item.logprob for item in choice.logprobs.content or []]
    return choice.message.content or "", answer.usage.prompt_tokens, logprobs


def pool_children(gateway: Proc) -> list[int]:
    """Pids of the gateway's descendants (the forkserver and the pool processes)."""
    found: list[int] = []
    todo = [gateway.popen.pid]
    while todo:
        pid = todo.pop()
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as children:
                kids = [int(k) for k in children.read().split()]
            found += kids
            todo += kids
    return found


@pytest.mark.parametrize("model", MODELS)
async def test_a_cache_hit_gives_the_worker_what_a_miss_gave(
    gateways: dict[str, Proc], model: str
) -> None:
    gateway = gateways[model]
    before = segments()
    hits0 = await metric(gateway, "tandem_mm_pixel_cache_hits_total")
    misses0 = await metric(gateway, "tandem_mm_pixel_cache_misses_total")
    messages = [turn(FIRST, SECOND)]
    first = await ask(gateway, model, messages)
    assert await metric(gateway, "tandem_mm_pixel_cache_misses_total") == misses0 + 2
    assert await metric(gateway, "tandem_mm_pixel_cache_hits_total") == hits0
    again = await ask(gateway, model, messages)
    assert await metric(gateway, "tandem_mm_pixel_cache_hits_total") == hits0 + 2
    assert await metric(gateway, "tandem_mm_pixel_cache_misses_total") == misses0 + 2
    # Same prompt as the worker saw it, same greedy answer; the logprobs agree to float
    # rounding only, as the worker's prefix cache serves the repeat (the unit tests,
    # test_mm_pixel_cache.py, prove the pixels bit-identical).
    assert again[:2] == first[:2]
    assert again[2] == pytest.approx(first[2], rel=1e-5)
    assert await metric(gateway, "tandem_mm_pixel_cache_bytes") > 0
    # The next turn: the history's two images again, a new one and the first once more.
    follow = [*messages, {"role": "assistant", "content": first[0]}, turn(THIRD, FIRST)]
    await ask(gateway, model, follow)
    assert await metric(gateway, "tandem_mm_pixel_cache_hits_total") == hits0 + 5
    assert await metric(gateway, "tandem_mm_pixel_cache_misses_total") == misses0 + 3
    assert await metric(gateway, "tandem_mm_inflight_bytes") == 0
    assert segments() == before
    # The forkserver and two pool processes; none of them loaded torch.
    children = pool_children(gateway)
    assert len(children) >= 3, children
    for pid in children:
        with open(f"/proc/{pid}/maps") as maps:
            assert "libtorch" not in maps.read(), pid
