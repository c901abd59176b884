"""Image preprocessing with the built-in models' PIL processors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tandem.models import load_processor


def _noise(size: tuple[int, int], seed: int = 0, mode: str = "RGB") -> Image.Image:
    w, h = size
    rgb = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    return Image.fromarray(rgb).convert(mode)


def test_qwen_large_image_is_capped(qwen_meta_dir: Path) -> None:
    out = load_processor(qwen_meta_dir).preprocess([_noise((1024, 1024))])
    assert out.grids["image_grid_thw"].tolist() == [[1, 16, 16]]
    assert out.grids["image_grid_thw"].dtype == np.int64
    assert out.tokens_per_image == [64]
    assert out.pixel_values.shape == (256, 3 * 2 * 16 * 16)
    assert out.pixel_values.dtype == np.float32
    assert out.patches_per_image is not None and out.patches_per_image.tolist() == [256]


def test_qwen_several_images_stack_their_patches(qwen_meta_dir: Path) -> None:
    out = load_processor(qwen_meta_dir).preprocess([_noise((128, 96)), _noise((10, 10), 1)])
    grids = out.grids["image_grid_thw"]
    assert grids.tolist() == [[1, 6, 8], [1, 2, 2]]  # the tiny one is raised to min_pixels
    assert out.tokens_per_image == [12, 1]
    assert out.patches_per_image is not None and out.patches_per_image.tolist() == [48, 4]
    assert out.pixel_values.shape[0] == 52
    assert len(out) == 2


def test_llava_fixed_resolution(llava_meta_dir: Path) -> None:
    out = load_processor(llava_meta_dir).preprocess([_noise((300, 200)), _noise((64, 64), 1)])
    assert out.pixel_values.shape == (2, 3, 64, 64)
    assert out.pixel_values.dtype == np.float32
    assert out.tokens_per_image == [64, 64]
    assert out.grids == {} and out.patches_per_image is None


@pytest.mark.parametrize("name", ["tiny-qwen3-vl", "tiny-llava-1.5"])
def test_deterministic_and_content_sensitive(name: str, meta_dirs: dict[str, Path]) -> None:
    processor = load_processor(meta_dirs[name])
    a1 = processor.preprocess([_noise((96, 96), 7)]).pixel_values
    a2 = processor.preprocess([_noise((96, 96), 7)]).pixel_values
    b = processor.preprocess([_noise((96, 96), 8)]).pixel_values
    np.testing.assert_array_equal(a1, a2)
    assert not np.array_equal(a1, b)


@pytest.mark.parametrize("name", ["tiny-qwen3-vl", "tiny-llava-1.5"])
def test_non_rgb_modes_are_converted(name: str, meta_dirs: dict[str, Path]) -> None:
    processor = load_processor(meta_dirs[name])
    rgb = processor.preprocess([_noise((64, 64))]).pixel_values
    for mode in ("RGBA", "L", "P"):
        out = processor.preprocess([_noise((64, 64), mode=mode)]).pixel_values
        assert out.shape == rgb.shape


@pytest.mark.parametrize("name", ["tiny-qwen3-vl", "tiny-llava-1.5"])
def test_no_images_is_an_error(name: str, meta_dirs: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match="no images"):
        load_processor(meta_dirs[name]).preprocess([])
