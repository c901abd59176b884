"""Raw uint8 pixels (for workers that normalize on device) and their late normalization.

vLLM engines with ``mm_device_do_normalize`` rescale and normalize inside the model, so
whoever preprocesses must send the resized uint8 values; everyone else gets the float32
values. Both must come from one preprocessing: raw, then ``normalize_raw`` == normalized.
"""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from tandem.models import load_processor
from tandem.wire.pixels import normalize_raw

FAMILIES = ["tiny-qwen3-vl", "tiny-llava-1.5"]


def _images() -> list[Image.Image]:
    rng = np.random.default_rng(3)
    sizes = [(64, 64), (200, 90), (37, 311)]
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for w, h in sizes]


@pytest.fixture(scope="module")
def model_dirs(qwen_dir, llava_dir) -> dict:
    return {"tiny-qwen3-vl": qwen_dir, "tiny-llava-1.5": llava_dir}


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("fast", [True, False], ids=["fast", "hf"])
def test_raw_then_normalized_is_bit_identical(name: str, fast: bool, model_dirs: dict) -> None:
    processor = load_processor(model_dirs[name], fast=fast)
    images = _images() if name == "tiny-qwen3-vl" else _images()[:1]
    normal = processor.preprocess(images)
    raw = processor.preprocess(images, raw=True)
    assert normal.normalize_lut is None
    assert raw.pixel_values.dtype == np.uint8
    assert raw.pixel_values.shape == normal.pixel_values.shape
    assert raw.normalize_lut is not None and raw.normalize_lut.shape == (3, 256)
    assert np.array_equal(normalize_raw(raw.pixel_values, raw.normalize_lut), normal.pixel_values)
    assert raw.tokens_per_image == normal.tokens_per_image
    for key, grid in normal.grids.items():
        assert np.array_equal(raw.grids[key], grid)


@pytest.mark.parametrize("name", FAMILIES)
def test_fast_and_hf_raw_pixels_agree(name: str, model_dirs: dict) -> None:
    images = _images()[:1]
    fast = load_processor(model_dirs[name]).preprocess(images, raw=True)
    ref = load_processor(model_dirs[name], fast=False).preprocess(images, raw=True)
    assert np.array_equal(fast.pixel_values, ref.pixel_values)
    assert np.array_equal(fast.normalize_lut, ref.normalize_lut)


@pytest.mark.parametrize("name", FAMILIES)
def test_raw_values_are_the_resized_pixels(name: str, model_dirs: dict) -> None:
    # A flat image stays flat through any resize and crop: every raw value is the colour.
    flat = Image.new("RGB", (90, 60), (77, 140, 3))
    raw = load_processor(model_dirs[name]).preprocess([flat], raw=True)
    by_channel = raw.pixel_values.reshape(raw.pixel_values.shape[0], 3, -1)
    for c, value in enumerate((77, 140, 3)):
        assert np.all(by_channel[:, c] == value)
