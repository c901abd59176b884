"""Decode fetched bytes into an RGB ``PIL.Image``, refusing bombs and unexpected formats."""

from __future__ import annotations

import io
from collections.abc import Callable

from PIL import Image, JpegImagePlugin, UnidentifiedImageError

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


# (width, height) of an image -> (width, height) the preprocessor will resize it to, or None.
ResizeTarget = Callable[[int, int], tuple[int, int] | None]

# libjpeg can decode straight to 1/2, 1/4 or 1/8 of the size ("draft" mode).
_DRAFT_SCALES: tuple[int, ...] = (8, 4, 2)


def decode_image(
    data: bytes, policy: MediaPolicy, resize_target: ResizeTarget | None = None
) -> Image.Image:
    """Decode one image to RGB (first frame of an animation).

    The header is parsed first (``Image.open`` is lazy) so that a small file declaring an
    enormous canvas is refused before any pixel buffer is allocated.

    With ``policy.jpeg_draft`` and a ``resize_target`` (the preprocessor's), a JPEG that
    will be shrunk a lot is decoded at a reduced scale that stays at least twice the
    resize target on each axis: roughly half the CPU of decode + resize, with pixels that
    differ slightly (not bit-exact) from a full decode.
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
        if policy.jpeg_draft and resize_target is not None:
            _request_draft(image, resize_target)
        try:
            image.load()
            return _to_rgb(image)
        except Image.DecompressionBombError as exc:
            raise MediaTooLarge(f"image exceeds the decoder's pixel limit: {exc}") from exc
        except (OSError, SyntaxError, ValueError, EOFError, IndexError) as exc:
            # Truncated streams raise OSError; broken chunk tables raise the others.
            raise MediaDecodeFailed(f"{image.format} image is truncated or corrupt: {exc}") from exc


def _request_draft(image: Image.Image, resize_target: ResizeTarget) -> None:
    """Ask libjpeg for the coarsest scale that leaves the resize target where it was.

    Called after the pixel cap has been checked against the declared size. The scale must
    keep >= 2x the target on each axis (PIL's own rule for ``draft``), and the target
    computed from the smaller size must equal the full-size one: otherwise the Qwen grid,
    hence the image's token count, could depend on this option.
    """
    if not isinstance(image, JpegImagePlugin.JpegImageFile):
        return  # PNG & co. have no reduced-scale decoding
    width, height = image.size
    target = resize_target(width, height)
    if target is None or min(target) <= 0:
        return
    for scale in _DRAFT_SCALES:
        if width // (2 * target[0]) < scale or height // (2 * target[1]) < scale:
            continue
        if resize_target(-(-width // scale), -(-height // scale)) != target:
            continue
        # PIL picks the largest power of two <= min(width // w, height // h); asking for
        # (width // scale, height // scale) makes that exactly `scale`.
        image.draft("RGB", (width // scale, height // scale))
        return


def _to_rgb(image: Image.Image) -> Image.Image:
    if image.mode == "RGB":
        # A new Image sharing the decoded pixel core (no copy): unlike the ImageFile it
        # holds no file object or decoder state, and leaving the `with` in decode_image
        # closes only the file, never the core.
        return image._new(image.im)
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
