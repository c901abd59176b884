"""Decode fetched bytes into an RGB ``PIL.Image``, refusing bombs and unexpected formats."""

from __future__ import annotations

from collections.abc import Callable

from PIL import Image, JpegImagePlugin

from tandem.media.errors import MediaDecodeFailed, MediaTooLarge
from tandem.media.header import ALLOWED_FORMATS, check_pixels, open_image
from tandem.media.policy import MediaPolicy

__all__ = ["ALLOWED_FORMATS", "ResizeTarget", "decode_image"]


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
    image = open_image(data)
    with image:
        width, height = image.size
        check_pixels(width, height, policy)
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
