"""Short videos of the built-in picture world: one shape on a plain background, frame after
frame, encoded as H.264 in MP4 with PyAV (the same library the gateway decodes with).

Torch-free. Tests and benchmarks draw their clips here (and training its frames, with
:func:`shifted`), so that a clip's answer is known ("a red circle"): every frame shows the
picture :func:`tandem.engine.builtin_shapes.draw` makes, the shape drifting a little from
frame to frame so that the frames are not all equal.
"""

from __future__ import annotations

import io
from fractions import Fraction

import numpy as np
from PIL import Image, ImageDraw

from tandem.engine.builtin_shapes import COLOURS, SHAPES, draw


def shape_clip(
    colour: str,
    shape: str,
    *,
    frames: int = 8,
    fps: int = 4,
    size: tuple[int, int] = (128, 96),
    drift: int = 2,
) -> bytes:
    """MP4 bytes of ``frames`` frames (``size`` = width, height; even sides) at ``fps``.

    The shape moves ``drift`` pixels to the right per frame.
    """
    if colour not in COLOURS or shape not in SHAPES:
        raise ValueError(f"unknown colour/shape {colour!r}/{shape!r}")
    base = draw(colour, shape, size).image
    pictures = [shifted(base, k * drift) for k in range(frames)]
    return encode_mp4(pictures, fps)


def noise_clip(frames: int, size: tuple[int, int], fps: int = 25, seed: int = 0) -> bytes:
    """A clip of random pixels (for byte-size and decoding-cost tests and benchmarks)."""
    rng = np.random.default_rng(seed)
    width, height = size
    pictures = [
        Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
        for _ in range(frames)
    ]
    return encode_mp4(pictures, fps)


def moving_box_clip(seconds: float, size: tuple[int, int], fps: int = 30) -> bytes:
    """A realistic-weight clip (e.g. 10 s of 1280x720): a box crossing a gradient."""
    width, height = size
    ramp = np.linspace(0, 255, width, dtype=np.float32)
    background = np.broadcast_to(ramp[None, :, None], (height, width, 3)).astype(np.uint8)
    pictures = []
    count = round(seconds * fps)
    for k in range(count):
        image = Image.fromarray(background.copy())
        x = int((width - height // 3) * k / max(1, count - 1))
        ImageDraw.Draw(image).rectangle((x, height // 3, x + height // 3, 2 * height // 3), "red")
        pictures.append(image)
    return encode_mp4(pictures, fps)


def encode_mp4(pictures: list[Image.Image], fps: int) -> bytes:
    """H.264 (yuv420p) in MP4; every picture the same even size."""
    import av

    if not pictures:
        raise ValueError("a clip needs at least one frame")
    width, height = pictures[0].size
    if width % 2 or height % 2:
        raise ValueError(f"H.264 in yuv420p needs even sides, got {width}x{height}")
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=Fraction(fps, 1))
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        # Near-lossless and deterministic: the same pictures always give the same bytes.
        stream.options = {"crf": "4", "preset": "veryfast", "threads": "1"}
        for picture in pictures:
            frame = av.VideoFrame.from_image(picture.convert("RGB"))
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buffer.getvalue()


def shifted(image: Image.Image, dx: int) -> Image.Image:
    """``image`` moved ``dx`` pixels right, the uncovered strip filled with its left edge."""
    if dx == 0:
        return image.copy()
    moved = Image.new("RGB", image.size, image.getpixel((0, 0)))
    moved.paste(image, (dx, 0))
    return moved
