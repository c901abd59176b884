"""The built-in models read pictures: held-out shapes through the gateway, scored.

Held-out means drawn from the training distribution (engine/builtin_shapes.py) with a seed
training never used. Each model answers through a real gateway in front of a real worker,
with the official client: tiny-qwen3-vl on the router path and on the worker path (the
worker processes the image itself), tiny-llava-1.5 on the router path, the only one its
family has (its placeholders are not worker-expandable).
"""

from __future__ import annotations

import base64
import random
from pathlib import Path

import openai
import pytest

from tandem.engine.builtin_shapes import TEXT_ONLY_REPLY, random_picture
from tandem.engine.builtin_specs import BUILTIN_SPECS

from .processes import Proc, start_all

HELD_OUT_SEED = 20261201  # training draws from TrainingRecipe.seed (0)
PICTURES = 60
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
    colours = shapes = 0
    misses: list[tuple[str, str]] = []
    for _ in range(PICTURES):
        picture = random_picture(rng, recipe.image_sides)
        url = "data:image/png;base64," + base64.b64encode(picture.png()).decode()
        content = [
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": "What is in this picture?"},
        ]
        text, finish = _reply(gateways[case], model, content)
        assert finish == "stop", f"{text!r} did not end with the model's end-of-turn token"
        words = text.split()
        colours += picture.colour in words
        shapes += picture.shape in words
        if text.strip() != picture.answer:
            misses.append((text, picture.answer))
    assert colours >= 0.95 * PICTURES, f"colour right {colours}/{PICTURES}: {misses}"
    assert shapes >= 0.90 * PICTURES, f"shape right {shapes}/{PICTURES}: {misses}"


@pytest.mark.parametrize("case", ["qwen-router", "llava-router"])
def test_text_only_prompts_get_the_fixed_reply(gateways: dict[str, Proc], case: str) -> None:
    model, _ = CASES[case]
    for prompt in ("Hello, who are you?", "Write a poem about the sea."):
        text, finish = _reply(gateways[case], model, [{"type": "text", "text": prompt}])
        assert (text.strip(), finish) == (TEXT_ONLY_REPLY, "stop")
