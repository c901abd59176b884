"""The built-in models read pictures: held-out shapes through the gateway, scored.

Held-out means drawn from the training distribution (engine/builtin_shapes.py) with a seed
training never used. Each model answers through a real gateway in front of a real worker,
with the official client: tiny-qwen3-vl on the router path and on the worker path (the
worker processes the image itself), tiny-llava-1.5 on the router path, the only one its
family has (its placeholders are not worker-expandable). tiny-qwen3-vl also names held-out
clips (H.264 MP4s of a drifting shape, engine/builtin_clips.py) on both paths.
"""

from __future__ import annotations

import base64
import random
from pathlib import Path

import openai
import pytest

from tandem.engine.builtin_clips import encode_mp4, shifted
from tandem.engine.builtin_shapes import TEXT_ONLY_REPLY, ShapePicture, random_picture
from tandem.engine.builtin_specs import BUILTIN_SPECS

from .processes import Proc, start_all

HELD_OUT_SEED = 20261201  # training draws from TrainingRecipe.seed (0)
PICTURES = 60
CLIPS = 24
CASES = {
    "qwen-router": ("tiny-qwen3-vl", "router"),
    "qwen-worker": ("tiny-qwen3-vl", "worker"),
    "llava-router": ("tiny-llava-1.5", "router"),
}


@pytest.fixture(scope="module")
def gateways(model_cache: Path):
    models = sorted({model for model, _ in CASES.values()})
    procs = start_all([["worker", "--model", m, "--role", "both"] for m in models])
    workers = dict(zip(models, procs, strict=True))
    specs = [
        ["gateway", "--port", "0", "--mm-processing", path, "--worker-urls", workers[m].address]
        for m, path in CASES.values()
    ]
    started = dict(zip(CASES, start_all(specs), strict=True))
    yield started
    for proc in [*started.values(), *workers.values()]:
        proc.stop()


def _reply(gateway: Proc, model: str, content: list[dict]) -> tuple[str, str]:
    client = openai.OpenAI(base_url=f"{gateway.address}/v1", api_key="x", max_retries=0)
    completion = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": content}],
        max_tokens=24,
        temperature=0,
    )
    choice = completion.choices[0]
    return choice.message.content or "", choice.finish_reason


@pytest.mark.parametrize("case", list(CASES))
def test_held_out_pictures_are_named(gateways: dict[str, Proc], case: str) -> None:
    model, _ = CASES[case]
    recipe = BUILTIN_SPECS[model].training
    assert recipe is not None
    rng = random.Random(HELD_OUT_SEED)
    asked = []
    for _ in range(PICTURES):
        picture = random_picture(rng, recipe.image_sides)
        url = "data:image/png;base64," + base64.b64encode(picture.png()).decode()
        part = {"type": "image_url", "image_url": {"url": url}}
        asked.append((picture, part, "What is in this picture?"))
    _score(gateways[case], model, asked)


def _score(gateway: Proc, model: str, asked: list[tuple[ShapePicture, dict, str]]) -> None:
    """Every reply ends; colour right >= 95 %, shape >= 90 % of the time."""
    colours = shapes = 0
    misses: list[tuple[str, str]] = []
    for picture, part, question in asked:
        text, finish = _reply(gateway, model, [part, {"type": "text", "text": question}])
        assert finish == "stop", f"{text!r} did not end with the model's end-of-turn token"
        words = text.split()
        colours += picture.colour in words
        shapes += picture.shape in words
        if text.strip() != picture.answer:
            misses.append((text, picture.answer))
    count = len(asked)
    assert colours >= 0.95 * count, f"colour right {colours}/{count}: {misses}"
    assert shapes >= 0.90 * count, f"shape right {shapes}/{count}: {misses}"


@pytest.mark.parametrize("case", ["qwen-router", "llava-router"])
def test_text_only_prompts_get_the_fixed_reply(gateways: dict[str, Proc], case: str) -> None:
    model, _ = CASES[case]
    for prompt in ("Hello, who are you?", "Write a poem about the sea."):
        text, finish = _reply(gateways[case], model, [{"type": "text", "text": prompt}])
        assert (text.strip(), finish) == (TEXT_ONLY_REPLY, "stop")


@pytest.mark.parametrize("case", ["qwen-router", "qwen-worker"])
def test_held_out_clips_are_named(gateways: dict[str, Proc], case: str) -> None:
    model, _ = CASES[case]
    recipe = BUILTIN_SPECS[model].training
    assert recipe is not None
    rng = random.Random(HELD_OUT_SEED + 1)
    asked = []
    for _ in range(CLIPS):
        picture = random_picture(rng, recipe.image_sides)
        # Even sides (H.264 in yuv420p), 4 to 12 frames at 2 to 25 fps, drifting right.
        width, height = picture.image.width // 2 * 2, picture.image.height // 2 * 2
        image = picture.image.crop((0, 0, width, height))
        drift, count = rng.randint(0, 3), rng.randint(4, 12)
        frames = [shifted(image, k * drift) for k in range(count)]
        clip = encode_mp4(frames, rng.choice((2, 4, 8, 25)))
        url = "data:video/mp4;base64," + base64.b64encode(clip).decode()
        asked.append(
            (picture, {"type": "video_url", "video_url": {"url": url}}, "What is in this video?")
        )
    _score(gateways[case], model, asked)
