"""Decode fetched bytes into an RGB ``PIL.Image``, refusing bombs and unexpected formats."""

from __future__ import annotations

import io

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


def decode_image(data: bytes, policy: MediaPolicy) -> Image.Image:
    """Decode one image to RGB (first frame of an animation).

    The header is parsed first (``Image.open`` is lazy) so that a small file declaring an
    enormous canvas is refused before any pixel buffer is allocated.
    """
    if not data:
        raise MediaDecodeFailed("image is empty (0 bytes)")
    try:
        image = Image.open(io.BytesIO(data), formats=ALLOWED_FORMATS)
    except Image.DecompressionBombError as exc:
        # Pillow's own global cap fired while reading the header; same verdict as ours.
        raise MediaTooLarge(f"image dimensions exceed the decoder's pixel limit: {exc}") from exc
    except UnidentifiedImageError as exc:
        raise MediaDecodeFailed(_unsupported_message(data)) from exc
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise MediaDecodeFailed(f"image header is corrupt: {exc}") from exc
    with image:
        width, height = image.size
        if width * height > policy.max_image_pixels:
            raise MediaTooLarge(
                f"image is {width}x{height} = {width * height} pixels, over the "
                f"{policy.max_image_pixels}-pixel limit"
            )
        try:
            image.load()
            return _to_rgb(image)
        except Image.DecompressionBombError as exc:
            raise MediaTooLarge(f"image exceeds the decoder's pixel limit: {exc}") from exc
        except (OSError, SyntaxError, ValueError, EOFError, IndexError) as exc:
            # Truncated streams raise OSError; broken chunk tables raise the others.
            raise MediaDecodeFailed(f"{image.format} image is truncated or corrupt: {exc}") from exc


def _to_rgb(image: Image.Image) -> Image.Image:
    if image.mode == "RGB":
        # copy() detaches the pixels from the file object closed by the caller's `with`.
        return image.copy()
    if image.mode == "P" and "transparency" in image.info:
        # Same RGB values as a direct convert, without Pillow's palette-transparency warning.
        return image.convert("RGBA").convert("RGB")
    return image.convert("RGB")


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
