"""decode_image: the zero-copy RGB result and the opt-in JPEG draft decoding."""

from __future__ import annotations

import argparse
import io
from collections.abc import Callable

import pytest
from PIL import Image

from tandem.media import MediaPolicy, MediaTooLarge, decode_image
from tandem.media.flags import add_media_flags, media_policy_from_args

MakeImage = Callable[..., bytes]
DRAFT = MediaPolicy(jpeg_draft=True)


def _to_32x24(width: int, height: int) -> tuple[int, int]:
    return 32, 24  # a fixed-resolution processor (CLIP-like, without the crop)


def _encoded(fmt: str, size: tuple[int, int], mode: str = "RGB") -> bytes:
    image = Image.linear_gradient("L").resize(size).convert(mode)
    out = io.BytesIO()
    image.save(out, format=fmt)
    return out.getvalue()


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP", "BMP"])
def test_rgb_result_is_detached_from_the_file(fmt: str) -> None:
    data = _encoded(fmt, (40, 30))
    image = decode_image(data, MediaPolicy())
    # A plain Image (no ImageFile, no file object), still usable after decode's `with`.
    assert type(image) is Image.Image
    assert getattr(image, "fp", None) is None
    assert image.format is None
    assert image.tobytes() == Image.open(io.BytesIO(data)).convert("RGB").tobytes()
    image.putpixel((0, 0), (1, 2, 3))  # writable, as a copy was
    assert image.getpixel((0, 0)) == (1, 2, 3)


def test_draft_is_off_by_default() -> None:
    data = _encoded("JPEG", (512, 384))
    assert not MediaPolicy().jpeg_draft
    assert decode_image(data, MediaPolicy(), _to_32x24).size == (512, 384)


@pytest.mark.parametrize("mode", ["RGB", "L", "CMYK"])
def test_draft_decodes_a_jpeg_at_a_reduced_scale(mode: str) -> None:
    # Target 32x24: 1/8 would give 64x48, exactly twice the target.
    image = decode_image(_encoded("JPEG", (512, 384), mode), DRAFT, _to_32x24)
    assert image.size == (64, 48)
    assert image.mode == "RGB"


def test_draft_stays_at_least_twice_the_target() -> None:
    # 1/8 would leave 63 < 2*32 columns: the decoder must settle for 1/4.
    image = decode_image(_encoded("JPEG", (504, 512)), DRAFT, lambda w, h: (32, 32))
    assert image.size == (126, 128)


def test_draft_is_skipped_where_it_would_change_the_target() -> None:
    def target(width: int, height: int) -> tuple[int, int]:
        return (32, 32) if width == 512 else (30, 30)

    assert decode_image(_encoded("JPEG", (512, 512)), DRAFT, target).size == (512, 512)


def test_draft_without_a_target_or_a_reduction_decodes_in_full() -> None:
    data = _encoded("JPEG", (100, 100))
    assert decode_image(data, DRAFT).size == (100, 100)
    assert decode_image(data, DRAFT, lambda w, h: None).size == (100, 100)
    assert decode_image(data, DRAFT, lambda w, h: (60, 60)).size == (100, 100)


@pytest.mark.parametrize("fmt", ["PNG", "WEBP", "GIF", "BMP"])
def test_other_formats_are_unaffected(fmt: str) -> None:
    data = _encoded(fmt, (512, 384))
    exact = decode_image(data, MediaPolicy())
    drafted = decode_image(data, DRAFT, _to_32x24)
    assert drafted.size == (512, 384)
    assert drafted.tobytes() == exact.tobytes()


def test_pixel_cap_uses_the_declared_size_with_draft() -> None:
    data = _encoded("JPEG", (512, 384))
    # Decoded at 1/8 it would be 64x48, well under the cap; the declared size is not.
    with pytest.raises(MediaTooLarge, match="512x384"):
        decode_image(data, MediaPolicy(jpeg_draft=True, max_image_pixels=512 * 384 - 1), _to_32x24)


def test_flag_maps_to_the_policy() -> None:
    parser = argparse.ArgumentParser()
    add_media_flags(parser)
    assert not media_policy_from_args(parser.parse_args([])).jpeg_draft
    assert media_policy_from_args(parser.parse_args(["--mm-jpeg-draft"])).jpeg_draft
