from __future__ import annotations

import io
import struct
import warnings
import zlib
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from tandem.media import (
    MediaDecodeFailed,
    MediaError,
    MediaPolicy,
    MediaTooLarge,
    decode_image,
    media_hash,
)

MakeImage = Callable[..., bytes]


def _png_header_only(width: int, height: int) -> bytes:
    """A tiny PNG that declares a huge canvas: signature, IHDR, IEND and no pixel data."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF", "BMP"])
def test_supported_formats_decode_to_rgb(make_image: MakeImage, fmt: str) -> None:
    image = decode_image(make_image(fmt, (9, 7)), MediaPolicy())
    assert image.mode == "RGB"
    assert image.size == (9, 7)


def test_lossless_pixels_survive(make_image: MakeImage) -> None:
    data = make_image("PNG", (5, 4))
    expected = Image.open(io.BytesIO(data)).convert("RGB")
    assert decode_image(data, MediaPolicy()).tobytes() == expected.tobytes()


@pytest.mark.parametrize("mode", ["RGBA", "L"])
def test_alpha_and_greyscale_become_rgb(make_image: MakeImage, mode: str) -> None:
    data = make_image("PNG", (4, 4), mode)
    image = decode_image(data, MediaPolicy())
    assert image.mode == "RGB"
    assert image.tobytes() == Image.open(io.BytesIO(data)).convert("RGB").tobytes()


def test_palette_with_transparency_becomes_rgb_without_warnings() -> None:
    source = Image.new("P", (4, 4), 1)
    source.putpalette([0, 0, 0, 200, 10, 20] + [0] * 762)
    out = io.BytesIO()
    # Per-entry alpha (bytes) is the case Pillow warns about when converting straight to RGB.
    source.save(out, format="PNG", transparency=b"\x00\x80")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        image = decode_image(out.getvalue(), MediaPolicy())
    assert image.mode == "RGB"
    assert image.getpixel((0, 0)) == (200, 10, 20)


def test_animated_gif_gives_its_first_frame() -> None:
    frames = [Image.new("RGB", (6, 6), color) for color in ((250, 0, 0), (0, 0, 250))]
    out = io.BytesIO()
    frames[0].save(out, format="GIF", save_all=True, append_images=frames[1:], duration=50)
    red, _green, blue = decode_image(out.getvalue(), MediaPolicy()).getpixel((2, 2))
    assert red > 200 and blue < 50


def test_declared_giant_canvas_is_refused_before_decoding() -> None:
    # 9000x9000 = 81 Mpx: above the policy cap, below Pillow's own warning threshold. The
    # file has no pixel data, so only a header-time check can report "too large".
    bomb = _png_header_only(9000, 9000)
    assert len(bomb) < 100
    with pytest.raises(MediaTooLarge) as info:
        decode_image(bomb, MediaPolicy())
    assert info.value.code == "media_too_large"
    assert "9000x9000" in str(info.value)


def test_canvas_beyond_pillows_own_limit_is_also_too_large() -> None:
    with pytest.raises(MediaTooLarge):
        decode_image(_png_header_only(100_000, 100_000), MediaPolicy())


def test_pixel_cap_is_the_policys(make_image: MakeImage) -> None:
    data = make_image("PNG", (10, 10))
    assert decode_image(data, MediaPolicy(max_image_pixels=100)).size == (10, 10)
    with pytest.raises(MediaTooLarge):
        decode_image(data, MediaPolicy(max_image_pixels=99))


def _tiff(make_image: MakeImage) -> bytes:
    return make_image("TIFF", (4, 4))


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (_tiff, "TIFF"),
        (lambda mk: mk("ICO", (16, 16)), "ICO"),
        (lambda mk: b"%PDF-1.7\n...", "PDF"),
        (lambda mk: b"<svg width='1' height='1'/>", "SVG"),
        (lambda mk: b"hello, not an image", "not a recognised image"),
    ],
)
def test_unsupported_formats_are_named_in_a_clear_refusal(
    make_image: MakeImage, make: Callable[[MakeImage], bytes], named: str
) -> None:
    with pytest.raises(MediaDecodeFailed) as info:
        decode_image(make(make_image), MediaPolicy())
    message = str(info.value)
    assert named in message
    assert "JPEG, PNG, WEBP, GIF, BMP" in message


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_truncated_images_fail_to_decode(make_image: MakeImage, fmt: str) -> None:
    data = make_image(fmt, (64, 64))
    with pytest.raises(MediaDecodeFailed, match="corrupt"):
        decode_image(data[: len(data) // 2], MediaPolicy())


def test_empty_and_corrupt_headers_fail_to_decode() -> None:
    with pytest.raises(MediaDecodeFailed, match="empty"):
        decode_image(b"", MediaPolicy())
    with pytest.raises(MediaDecodeFailed):
        decode_image(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40, MediaPolicy())


@settings(max_examples=200, deadline=None)
@given(
    prefix=st.sampled_from([b"", b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF89a", b"BM", b"RIFF"]),
    tail=st.binary(max_size=300),
)
def test_decoder_raises_only_media_errors_on_arbitrary_bytes(prefix: bytes, tail: bytes) -> None:
    try:
        image = decode_image(prefix + tail, MediaPolicy(max_image_pixels=1 << 20))
    except MediaError:
        return
    assert image.mode == "RGB"


# --- hashing --------------------------------------------------------------------------


def test_blake3_known_answer() -> None:
    assert media_hash(b"") == "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"


@settings(max_examples=100)
@given(data=st.binary(max_size=2048))
def test_hash_is_64_lowercase_hex_and_sensitive_to_every_byte(data: bytes) -> None:
    digest = media_hash(data)
    assert len(digest) == 64
    assert digest == digest.lower()
    int(digest, 16)
    assert media_hash(data + b"\x00") != digest
    if data:
        flipped = bytes([data[0] ^ 1]) + data[1:]
        assert media_hash(flipped) != digest
