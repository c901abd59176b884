"""The fast preprocessing path gives the very bits of the transformers PIL processors."""

from __future__ import annotations

import io
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from tandem.media import MediaPolicy, decode_image
from tandem.models import PreprocessedImages, load_model_info, load_processor
from tandem.models.processor import LlavaImageProcessor, QwenImageProcessor

FAMILIES = ["tiny-qwen3-vl", "tiny-llava-1.5"]

SIZES = [
    (1, 1),
    (7, 5),
    (31, 97),  # not multiples of the 32-pixel Qwen factor
    (257, 129),
    (3000, 100),  # very wide
    (100, 3000),  # very tall
    (1024, 1024),
    (1920, 1080),
]


def _photo(size: tuple[int, int], seed: int = 0) -> Image.Image:
    """Smooth gradients plus noise: resampling filters see both flat areas and edges."""
    w, h = size
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    rng = np.random.default_rng(seed)
    channels = [128 + 100 * np.sin(x / (9 + c) + y / (13 + 2 * c)) for c in range(3)]
    pixels = np.stack(channels, axis=-1) + rng.normal(0, 20, (h, w, 3))
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def assert_same(fast: PreprocessedImages, ref: PreprocessedImages) -> None:
    assert fast.pixel_values.dtype == ref.pixel_values.dtype == np.float32
    assert fast.pixel_values.shape == ref.pixel_values.shape
    assert np.array_equal(fast.pixel_values, ref.pixel_values)
    assert fast.pixel_values.flags.c_contiguous
    assert fast.tokens_per_image == ref.tokens_per_image
    assert fast.grids.keys() == ref.grids.keys()
    for key, grid in ref.grids.items():
        assert fast.grids[key].dtype == grid.dtype
        assert np.array_equal(fast.grids[key], grid)
    if ref.patches_per_image is None:
        assert fast.patches_per_image is None
    else:
        assert fast.patches_per_image is not None
        assert fast.patches_per_image.dtype == ref.patches_per_image.dtype
        assert np.array_equal(fast.patches_per_image, ref.patches_per_image)


@pytest.fixture(scope="module", params=FAMILIES)
def pair(request: pytest.FixtureRequest, meta_dirs: dict[str, Path]):
    """(fast processor, HF reference processor) for one built-in model."""
    model_dir = meta_dirs[request.param]
    fast = load_processor(model_dir)
    assert fast.fast_path is not None, "the built-in config must take the fast path"
    return fast, load_processor(model_dir, fast=False)


@pytest.mark.parametrize("size", SIZES)
def test_bit_identical_over_sizes(pair, size: tuple[int, int]) -> None:
    fast, ref = pair
    images = [_photo(size, 1)]
    assert_same(fast.preprocess(images), ref.preprocess(images))


def test_bit_identical_for_a_batch_of_mixed_sizes(pair) -> None:
    fast, ref = pair
    images = [_photo(size, seed) for seed, size in enumerate([(640, 480), (33, 65), (1024, 1024)])]
    assert_same(fast.preprocess(images), ref.preprocess(images))


def _encode(image: Image.Image, fmt: str, **params: object) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt, **params)
    return out.getvalue()


@cache
def _decoded_inputs() -> dict[str, bytes]:
    photo = _photo((301, 203), 2)
    palette = photo.convert("P", palette=Image.Palette.ADAPTIVE, colors=64)
    return {
        "jpeg-rgb": _encode(photo, "JPEG", quality=90),
        "jpeg-l": _encode(photo.convert("L"), "JPEG"),
        "png-rgb": _encode(photo, "PNG"),
        "png-l": _encode(photo.convert("L"), "PNG"),
        "png-la": _encode(photo.convert("LA"), "PNG"),
        "png-rgba": _encode(photo.convert("RGBA"), "PNG"),
        "png-p": _encode(palette, "PNG"),
        "png-p-transparent": _encode(palette, "PNG", transparency=5),
        "png-rgb-colour-key": _encode(photo, "PNG", transparency=photo.getpixel((0, 0))),
        "gif": _encode(palette, "GIF", transparency=3),
        "webp": _encode(photo, "WEBP"),
        "bmp": _encode(photo, "BMP"),
    }


@pytest.mark.parametrize("kind", sorted(_decoded_inputs()))
def test_bit_identical_on_decoded_images_of_every_mode(pair, kind: str) -> None:
    fast, ref = pair
    data = _decoded_inputs()[kind]
    images = [decode_image(data, MediaPolicy()), decode_image(data, MediaPolicy())]
    assert_same(fast.preprocess(images), ref.preprocess(images))


@pytest.mark.parametrize("mode", ["RGB", "L", "LA", "RGBA", "P", "PA", "CMYK"])
def test_bit_identical_on_raw_modes(pair, mode: str) -> None:
    # Not only via decode_image: a P image with a colour key keeps it in info after the
    # RGB conversion, and HF then composites that colour onto white.
    fast, ref = pair
    image = _photo((90, 70), 3).convert(mode)
    if mode == "P":
        image.info["transparency"] = 7
    assert_same(fast.preprocess([image]), ref.preprocess([image]))


@settings(max_examples=30, deadline=None)
@given(
    width=st.integers(1, 700),
    height=st.integers(1, 700),
    seed=st.integers(0, 2**16),
)
def test_size_sweep(meta_dirs: dict[str, Path], width: int, height: int, seed: int) -> None:
    for name in FAMILIES:
        fast = load_processor(meta_dirs[name])
        ref = load_processor(meta_dirs[name], fast=False)
        images = [_photo((width, height), seed)]
        try:
            expected = ref.preprocess(images)
        except ValueError as exc:  # e.g. Qwen's aspect-ratio limit: the same refusal
            with pytest.raises(ValueError, match="aspect ratio"):
                fast.preprocess(images)
            assert "aspect ratio" in str(exc)
            continue
        assert_same(fast.preprocess(images), expected)


def test_extreme_aspect_ratio_is_refused_like_hf(meta_dirs: dict[str, Path]) -> None:
    processor = load_processor(meta_dirs["tiny-qwen3-vl"])
    with pytest.raises(ValueError, match="aspect ratio must be smaller than 200"):
        processor.preprocess([Image.new("RGB", (1, 300))])
    assert processor.resize_target(1, 300) is None


def test_resize_targets(meta_dirs: dict[str, Path]) -> None:
    qwen = load_processor(meta_dirs["tiny-qwen3-vl"])
    assert qwen.resize_target(1024, 1024) == (256, 256)
    assert qwen.resize_target(1920, 1080) == (320, 192)
    assert qwen.resize_target(10, 10) == (32, 32)
    llava = load_processor(meta_dirs["tiny-llava-1.5"])
    assert llava.resize_target(1920, 1080) == (113, 64)  # shortest edge 64, then crop
    assert llava.resize_target(64, 300) == (64, 300)


def _variant(meta_dirs: dict[str, Path], name: str, **overrides: object):
    """(fast, reference) processors built from the model's config with overrides."""
    model_dir = meta_dirs[name]
    info = load_model_info(model_dir)
    if name == "tiny-qwen3-vl":
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
            Qwen2VLImageProcessorPil,
        )

        hf = Qwen2VLImageProcessorPil.from_pretrained(model_dir, **overrides)
        return QwenImageProcessor(info, hf), QwenImageProcessor(info, hf, fast=False)
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    hf = CLIPImageProcessorPil.from_pretrained(model_dir, **overrides)
    return LlavaImageProcessor(info, hf), LlavaImageProcessor(info, hf, fast=False)


@pytest.mark.parametrize(
    ("name", "overrides"),
    [
        ("tiny-qwen3-vl", {"patch_size": 14, "merge_size": 2, "temporal_patch_size": 1}),
        ("tiny-qwen3-vl", {"image_mean": [0.1, 0.2, 0.3], "image_std": [0.7, 0.8, 0.9]}),
        ("tiny-qwen3-vl", {"do_normalize": False, "resample": 2}),
        ("tiny-qwen3-vl", {"do_rescale": False, "merge_size": 1}),
        ("tiny-qwen3-vl", {"min_pixels": 4096, "max_pixels": 200_000}),
        ("tiny-llava-1.5", {"size": {"height": 40, "width": 50}}),
        ("tiny-llava-1.5", {"crop_size": {"height": 80, "width": 96}}),  # zero-padded crop
        ("tiny-llava-1.5", {"do_center_crop": False, "size": {"height": 48, "width": 48}}),
        ("tiny-llava-1.5", {"do_resize": False, "crop_size": {"height": 30, "width": 20}}),
        ("tiny-llava-1.5", {"do_normalize": False, "do_rescale": False, "resample": 1}),
        ("tiny-llava-1.5", {"image_mean": 0.5, "image_std": 0.25}),
    ],
)
def test_config_variants_stay_bit_identical(
    meta_dirs: dict[str, Path], name: str, overrides: dict[str, object]
) -> None:
    fast, ref = _variant(meta_dirs, name, **overrides)
    assert fast.fast_path is not None
    images = [_photo((123, 77), 4), _photo((64, 200), 5)]
    assert_same(fast.preprocess(images), ref.preprocess(images))


def test_unsupported_config_falls_back_to_hf(meta_dirs: dict[str, Path]) -> None:
    # Padding is not implemented by the fast path: the HF processor must do the work.
    fast, ref = _variant(meta_dirs, "tiny-llava-1.5", do_pad=True)
    assert fast.fast_path is None
    assert fast.resize_target(100, 100) is None
    images = [_photo((100, 80), 6)]
    assert_same(fast.preprocess(images), ref.preprocess(images))
