"""Built-in models generated once per test session, and helpers to build prompts for them."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from tandem.engine.builtin import BUILTIN_MODELS, builtin_dir, generate_builtin
from tandem.engine.builtin_shapes import draw
from tandem.engine.runner import ModelRunner, SequenceState
from tandem.engine.types import MediaInputs, MediaItem
from tandem.models import expand_placeholders, load_model_info, load_processor, render_chat


@pytest.fixture(scope="session")
def builtin_cache(tmp_path_factory: pytest.TempPathFactory, model_cache: Path) -> Iterator[Path]:
    """A private model cache for the session, also exported as TANDEM_CACHE_DIR.

    It starts with copies of the session's trained checkpoints (tests/conftest.py), so the
    generation tests can watch a cache without training the models once more.
    """
    root = tmp_path_factory.mktemp("tandem-models")
    for name in BUILTIN_MODELS:
        trained = builtin_dir(name, model_cache)
        shutil.copytree(trained, root / trained.name)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TANDEM_CACHE_DIR", str(root))
        yield root


@pytest.fixture(scope="session")
def builtin_dirs(builtin_cache: Path) -> dict[str, Path]:
    return {name: generate_builtin(name, builtin_cache) for name in BUILTIN_MODELS}


@pytest.fixture(scope="session")
def runners(builtin_dirs: dict[str, Path]) -> dict[str, ModelRunner]:
    return {name: ModelRunner.load(path) for name, path in builtin_dirs.items()}


def _solid(color: tuple[int, int, int], size: tuple[int, int] = (128, 128)) -> Image.Image:
    return Image.new("RGB", size, color)


def _gradient(size: tuple[int, int]) -> Image.Image:
    w, h = size
    rgb = np.zeros((h, w, 3), dtype=np.uint8)
    rgb[..., 0] = np.linspace(0, 255, w, dtype=np.uint8)[None, :]
    rgb[..., 1] = np.linspace(0, 255, h, dtype=np.uint8)[:, None]
    rgb[..., 2] = 128
    return Image.fromarray(rgb)


def _checker(size: tuple[int, int], cell: int) -> Image.Image:
    w, h = size
    ys, xs = np.mgrid[0:h, 0:w]
    on = ((xs // cell + ys // cell) % 2).astype(np.uint8) * 255
    return Image.fromarray(np.stack([on, 255 - on, on // 2], axis=-1))


PICTURES = (("red", "circle"), ("blue", "circle"), ("red", "square"), ("green", "triangle"))


@pytest.fixture(scope="session")
def images() -> dict[str, Image.Image]:
    """Test images; same-size pairs among them differ only in content."""
    return {
        "red": _solid((255, 0, 0)),
        "blue": _solid((0, 0, 255)),
        "white": _solid((255, 255, 255)),
        "gradient": _gradient((128, 128)),
        "gradient_wide": _gradient((192, 96)),
        "checker": _checker((160, 160), 16),
        "big": _gradient((1024, 1024)),
        # Pictures the built-in models were trained to name (engine/builtin_shapes.py).
        **{f"{c}_{s}": draw(c, s, (128, 128)).image for c, s in PICTURES},
    }


@dataclass
class Prompt:
    ids: list[int]
    media: MediaInputs | None

    def without_pixels(self) -> MediaInputs | None:
        """The decode leg's view: identity, ranges and grids, no pixels."""
        if self.media is None:
            return None
        m = self.media
        return MediaInputs(items=list(m.items), im_token_id=m.im_token_id, grids=dict(m.grids))


PromptFactory = Callable[[str, Sequence[Image.Image], str], Prompt]


@pytest.fixture(scope="session")
def make_prompt(builtin_dirs: dict[str, Path]) -> PromptFactory:
    """Render, tokenize, preprocess and expand a one-turn chat prompt, as the gateway does."""
    from tokenizers import Tokenizer

    tokenizers = {
        n: Tokenizer.from_file(str(d / "tokenizer.json")) for n, d in builtin_dirs.items()
    }

    def build(name: str, images: Sequence[Image.Image], text: str) -> Prompt:
        model_dir = builtin_dirs[name]
        info = load_model_info(model_dir)
        parts: list[dict[str, object]] = [{"type": "image"} for _ in images]
        parts.append({"type": "text", "text": text})
        rendered = render_chat(model_dir, [{"role": "user", "content": parts}])
        ids = tokenizers[name].encode(rendered, add_special_tokens=False).ids
        if not images:
            return Prompt(ids, None)
        pre = load_processor(model_dir).preprocess(list(images))
        ids, ranges = expand_placeholders(
            ids, info.anchor_token_id, pre.tokens_per_image, info.image_token_id
        )
        items = [MediaItem(f"img{k}", off, n) for k, (off, n) in enumerate(ranges)]
        media = MediaInputs(items, info.image_token_id, pre.pixel_values, dict(pre.grids))
        return Prompt(ids, media)

    return build


Greedy = Callable[[ModelRunner, torch.Tensor, SequenceState, int], list[int]]


@pytest.fixture(scope="session")
def greedy() -> Greedy:
    """n greedy tokens starting from prefill logits (the state advances in place)."""

    def run(runner: ModelRunner, logits: torch.Tensor, state: SequenceState, n: int) -> list[int]:
        tokens = [int(logits.argmax())]
        while len(tokens) < n:
            tokens.append(int(runner.decode_step(state, tokens[-1]).argmax()))
        return tokens

    return run
