"""Image headers: the declared size and decode cost, read without decoding a pixel."""

from __future__ import annotations

import io
import struct
import zlib

import pytest
from PIL import Image

from tandem.media import MediaDecodeFailed, MediaPolicy, MediaTooLarge
from tandem.media.header import read_image_header

MiB = 1 << 20


def _chunk(kind: bytes, body: bytes) -> bytes:
    crc = struct.pack(">I", zlib.crc32(kind + body))
    return struct.pack(">I", len(body)) + kind + body + crc


def png_declaring(width: int, height: int, colour_type: int = 2) -> bytes:
    """A PNG of a few dozen bytes that declares a ``width x height`` canvas (no pixels)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, colour_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IEND", b"")


def encoded(image: Image.Image, fmt: str, **options: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def test_a_png_header_gives_size_and_cost_without_decoding() -> None:
    # 8192x8192 RGB: 256 MiB once decoded (Pillow keeps RGB at four bytes a pixel), read
    # from 45 bytes that hold no pixel data at all.
    data = png_declaring(8192, 8192)
    assert len(data) < 64
    header = read_image_header(data, MediaPolicy())
    assert (header.width, header.height, header.mode, header.format) == (8192, 8192, "RGB", "PNG")
    assert header.decoded_bytes == 8192 * 8192 * 4 == 256 * MiB


@pytest.mark.parametrize(
    ("mode", "options", "per_pixel"),
    [
        ("RGB", {}, 4),
        ("L", {}, 1 + 4),  # the frame, then its RGB copy
        ("RGBA", {}, 4 + 4),
        ("P", {}, 1 + 4),
        ("P", {"transparency": 0}, 1 + 4 + 4),  # through RGBA on the way to RGB
        ("L", {"transparency": 0}, 1 + 4 + 12),  # composited onto white by the preprocessor
        ("RGB", {"transparency": (1, 2, 3)}, 4 + 12),
    ],
)
def test_png_modes_cost_what_pillow_stores(mode: str, options: dict, per_pixel: int) -> None:
    data = encoded(Image.new(mode, (40, 30)), "PNG", **options)
    header = read_image_header(data, MediaPolicy())
    assert header.mode == mode
    assert header.transparency == bool(options)
    assert header.decoded_bytes == 40 * 30 * per_pixel


@pytest.mark.parametrize(("mode", "per_pixel"), [("RGB", 4), ("L", 1 + 4), ("CMYK", 4 + 4)])
def test_jpeg_headers(mode: str, per_pixel: int) -> None:
    data = encoded(Image.new(mode, (64, 48)), "JPEG")
    header = read_image_header(data, MediaPolicy())
    assert (header.width, header.height, header.mode, header.format) == (64, 48, mode, "JPEG")
    assert header.decoded_bytes == 64 * 48 * per_pixel


def test_the_pixel_cap_is_applied_to_the_declared_size() -> None:
    with pytest.raises(MediaTooLarge, match="over the 1000000-pixel limit"):
        read_image_header(png_declaring(1001, 1000), MediaPolicy(max_image_pixels=1_000_000))


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (b"", "empty"),
        (b"\x89PNG\r\n\x1a\n\x00\x00", "not a recognised image"),  # a cut-off chunk
        (png_declaring(64, 48)[:20], "corrupt"),  # IHDR cut short
        (b"II*\x00" + b"\x00" * 32, "unsupported image format TIFF"),
        (b"hello, not an image at all", "not a recognised image"),
    ],
    ids=["empty", "cut-after-signature", "cut-ihdr", "tiff", "garbage"],
)
def test_malformed_headers_are_decode_failures(data: bytes, needle: str) -> None:
    with pytest.raises(MediaDecodeFailed, match=needle) as info:
        read_image_header(data, MediaPolicy())
    assert info.value.code == "multimodal_processing_failed"
    assert not info.value.retryable
