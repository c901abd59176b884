"""What an encoded image will cost once decoded, read from its header without decoding it.

``Image.open`` is lazy: it parses the header (size, mode, palette transparency) and stops
before the pixel data. That is enough to refuse a decompression bomb, and to charge the
bytes the decode will take against a memory budget *before* any pixel buffer exists
(docs/operations.md, "Memory bounds for images").
"""

from __future__ import annotations

import io
from dataclasses import dataclass

from PIL import Image, UnidentifiedImageError

from tandem.media.errors import MediaDecodeFailed, MediaTooLarge
from tandem.media.policy import MediaPolicy

# Pillow plugin names. Restricting Image.open to these also keeps every other (less audited)
# format parser away from untrusted bytes.
ALLOWED_FORMATS: tuple[str, ...] = ("JPEG", "PNG", "WEBP", "GIF", "BMP")

# Magic numbers of formats people commonly send, so a refusal can say what was received.
_KNOWN_SIGNATURES: tuple[tuple[bytes, str], ...] = (
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
    (b"\x00\x00\x01\x00", "ICO"),
    (b"%PDF", "PDF"),
    (b"8BPS", "PSD"),
    (b"\x00\x00\x00\x0cjP  ", "JPEG 2000"),
)

# Bytes Pillow stores per pixel. Every multi-band mode (RGB included) takes four bytes a
# pixel in Pillow's image memory, not one per band; one-band modes take their sample size.
_ONE_BYTE_MODES = frozenset({"1", "L", "P"})
_FOUR_BYTE_ONE_BAND_MODES = frozenset({"I", "F"})
_RGB_BYTES = 4


@dataclass(frozen=True, slots=True)
class ImageHeader:
    """An image as its header declares it."""

    width: int
    height: int
    mode: str  # Pillow mode of the decoded first frame, e.g. "RGB", "L", "P"
    format: str  # one of ALLOWED_FORMATS
    transparency: bool  # a colour key or palette transparency (not an alpha band)

    @property
    def pixels(self) -> int:
        return self.width * self.height

    @property
    def decoded_bytes(self) -> int:
        """Peak bytes of decoding this image to RGB and handing it to the preprocessor.

        Measured on Pillow's storage (tests/unit/media/test_media_header.py): the decoded
        frame in its own mode, plus the RGB copy when the mode is not RGB; palette
        transparency goes through an RGBA step; a colour key on an L or RGB image is
        composited onto white by the preprocessor (three more RGBA-sized images). JPEG
        draft decoding (``--mm-jpeg-draft``) can only make the real figure smaller.
        """
        native = _bytes_per_pixel(self.mode)
        per_pixel = native if self.mode == "RGB" else native + _RGB_BYTES
        if self.transparency:
            per_pixel += _RGB_BYTES if self.mode == "P" else 3 * _RGB_BYTES
        return self.pixels * per_pixel


def _bytes_per_pixel(mode: str) -> int:
    if mode in _ONE_BYTE_MODES:
        return 1
    if mode.startswith("I;16"):
        return 2
    if mode in _FOUR_BYTE_ONE_BAND_MODES:
        return 4
    return 4  # every multi-band mode


def open_image(data: bytes) -> Image.Image:
    """``Image.open`` over the allowed formats, header errors as ``MediaError``.

    The result is lazy: no pixel has been decoded yet. The caller closes it.
    """
    if not data:
        raise MediaDecodeFailed("image is empty (0 bytes)")
    try:
        return Image.open(io.BytesIO(data), formats=ALLOWED_FORMATS)
    except Image.DecompressionBombError as exc:
        # Pillow's own global cap fired while reading the header; same verdict as ours.
        raise MediaTooLarge(f"image dimensions exceed the decoder's pixel limit: {exc}") from exc
    except UnidentifiedImageError as exc:
        raise MediaDecodeFailed(_unsupported_message(data)) from exc
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise MediaDecodeFailed(f"image header is corrupt: {exc}") from exc


def check_pixels(width: int, height: int, policy: MediaPolicy) -> None:
    """The decompression-bomb cap on declared pixels (``--mm-max-image-pixels``)."""
    if width * height > policy.max_image_pixels:
        raise MediaTooLarge(
            f"image is {width}x{height} = {width * height} pixels, over the "
            f"{policy.max_image_pixels}-pixel limit"
        )


def read_image_header(data: bytes, policy: MediaPolicy) -> ImageHeader:
    """The declared size and mode of an encoded image; nothing is decoded.

    Raises ``MediaDecodeFailed`` for bytes that are not an allowed image or whose header is
    corrupt, ``MediaTooLarge`` above ``policy.max_image_pixels``: the same refusals
    ``decode_image`` would give, before any pixel memory is taken.
    """
    with open_image(data) as image:
        width, height = image.size
        check_pixels(width, height, policy)
        transparency = image.info.get("transparency") is not None
        return ImageHeader(width, height, image.mode, str(image.format), transparency)


def _unsupported_message(data: bytes) -> str:
    accepted = ", ".join(ALLOWED_FORMATS)
    for magic, name in _KNOWN_SIGNATURES:
        if data.startswith(magic):
            return f"unsupported image format {name}; accepted formats: {accepted}"
    if data[4:8] == b"ftyp":
        return f"unsupported image format HEIF/AVIF; accepted formats: {accepted}"
    if data.lstrip()[:1] == b"<":
        return f"unsupported image format SVG/XML; accepted formats: {accepted}"
    return f"data is not a recognised image; accepted formats: {accepted}"
