"""JPEG draft decoding (media policy ``jpeg_draft``): close to exact, same grids and tokens."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tandem.media import MediaPolicy, decode_image
from tandem.models import load_processor

# Size sweeps over large pictures: left out of `make test-unit`, run by `make test`.
pytestmark = pytest.mark.fuzz

FAMILIES = ["tiny-qwen3-vl", "tiny-llava-1.5"]
EXACT = MediaPolicy()
DRAFT = MediaPolicy(jpeg_draft=True)


def _jpeg(size: tuple[int, int], seed: int = 0) -> bytes:
    # Photo-like content as in bench/scenarios.py: gradients plus mild noise.
    w, h = size
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    rng = np.random.default_rng(seed)
    channels = [
        128 + 100 * np.sin(x / (40 + 10 * c) + y / (70 + 5 * c)) + rng.normal(0, 8, (h, w))
        for c in range(3)
    ]
    pixels = np.clip(np.stack(channels, axis=-1), 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=90)
    return out.getvalue()


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("size", [(1024, 1024), (1920, 1080), (1080, 1920), (4000, 600)])
def test_draft_is_close_to_exact_and_keeps_the_grid(
    meta_dirs: dict[str, Path], name: str, size: tuple[int, int]
) -> None:
    processor = load_processor(meta_dirs[name])
    data = _jpeg(size)
    drafted = decode_image(data, DRAFT, processor.resize_target)
    assert drafted.size != size, "a large JPEG should be decoded at a reduced scale"
    target = processor.resize_target(*size)
    assert target is not None
    assert drafted.width >= 2 * target[0] and drafted.height >= 2 * target[1]

    exact = processor.preprocess([decode_image(data, EXACT, processor.resize_target)])
    approx = processor.preprocess([drafted])
    assert approx.tokens_per_image == exact.tokens_per_image
    for key, grid in exact.grids.items():
        assert np.array_equal(approx.grids[key], grid)
    assert approx.pixel_values.shape == exact.pixel_values.shape
    diff = np.abs(approx.pixel_values - exact.pixel_values)
    # Normalised units (Qwen: 2/255 per pixel level, CLIP: about 4/255); measured max ~0.03.
    assert diff.max() <= 0.05
    assert diff.mean() <= 0.01


@pytest.mark.parametrize("name", FAMILIES)
def test_without_the_option_decoding_is_exact(meta_dirs: dict[str, Path], name: str) -> None:
    fast = load_processor(meta_dirs[name])
    ref = load_processor(meta_dirs[name], fast=False)
    data = _jpeg((1024, 768), 1)
    image = decode_image(data, EXACT, fast.resize_target)
    assert image.size == (1024, 768)
    reference = Image.open(io.BytesIO(data)).convert("RGB")
    assert image.tobytes() == reference.tobytes()
    got = fast.preprocess([image]).pixel_values
    assert np.array_equal(got, ref.preprocess([reference]).pixel_values)


@pytest.mark.parametrize("width", range(1000, 1100, 7))
def test_grid_never_depends_on_the_draft(meta_dirs: dict[str, Path], width: int) -> None:
    # Sizes not divisible by the draft scale change the aspect ratio slightly; the scale is
    # only used where the resize target (hence Qwen's grid) stays the same.
    processor = load_processor(meta_dirs["tiny-qwen3-vl"])
    for height in (517, 700, 1333):
        data = _jpeg((width, height), 2)
        drafted = decode_image(data, DRAFT, processor.resize_target)
        assert processor.resize_target(*drafted.size) == processor.resize_target(width, height)
