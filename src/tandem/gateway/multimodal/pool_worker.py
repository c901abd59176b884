"""What runs inside an image pool process: decode and preprocess one image.

The forkserver preloads it (pool_preload.py, which blocks torch first), so every pool
process forked from the server starts with numpy, Pillow and this module imported.

The same :func:`decode_and_preprocess` serves ``--mm-workers 0`` in the gateway's own
thread, so both modes give the same bits.
"""

from __future__ import annotations

import pickle
import sys
import time
from dataclasses import dataclass

import numpy as np
from PIL import Image

from tandem.gateway.multimodal.pixel_segments import write_segment
from tandem.media import MediaError, MediaPolicy, decode_image
from tandem.models.image_batch import preprocess_one_at_a_time
from tandem.models.processor import ImageProcessor, PreprocessedImages

# Processors by fingerprint; a gateway serves one model, a few covers a reload.
_PROCESSORS: dict[str, ImageProcessor] = {}
_MAX_PROCESSORS = 4


@dataclass(frozen=True, slots=True)
class ImageTask:
    """One image for a pool process. ``processor`` is the pickled ImageProcessor."""

    fingerprint: str
    processor: bytes
    data: bytes
    policy: MediaPolicy
    raw: bool
    segment: str  # where to write the pixels (named by the gateway)


@dataclass(frozen=True, slots=True)
class ImageDone:
    """A pool process's answer: the pixels are in the task's segment, the rest is here."""

    shape: tuple[int, ...]
    dtype: str
    tokens: int
    grids: dict[str, np.ndarray]
    patches: np.ndarray | None
    lut: np.ndarray | None
    decode_s: float
    preprocess_s: float


@dataclass(frozen=True, slots=True)
class ImageFailed:
    """The client's image was refused (a MediaError or a processor's ValueError)."""

    code: str | None  # a MediaError's code; None for a ValueError of the processor
    message: str


def decode_and_preprocess(
    data: bytes, processor: ImageProcessor, policy: MediaPolicy, raw: bool
) -> tuple[PreprocessedImages, float, float]:
    """One image: (its preprocessed arrays, decode seconds, preprocess seconds)."""
    decode_s = 0.0

    def decode(blob: bytes) -> Image.Image:
        nonlocal decode_s
        began = time.perf_counter()
        image = decode_image(blob, policy, processor.resize_target)
        decode_s = time.perf_counter() - began
        return image

    started = time.perf_counter()
    pre = preprocess_one_at_a_time([data], decode, processor, raw=raw)
    return pre, decode_s, time.perf_counter() - started - decode_s


def warm() -> bool:
    """A pool process's first task: proves it started; True if torch got loaded (a bug)."""
    return sys.modules.get("torch") is not None


def run_task(task: ImageTask) -> ImageDone | ImageFailed:
    processor = _processor(task.fingerprint, task.processor)
    try:
        pre, decode_s, preprocess_s = decode_and_preprocess(
            task.data, processor, task.policy, task.raw
        )
    except MediaError as exc:
        return ImageFailed(exc.code, exc.message)
    except ValueError as exc:
        return ImageFailed(None, str(exc))
    pixels = pre.pixel_values
    write_segment(task.segment, pixels)
    return ImageDone(
        shape=tuple(pixels.shape),
        dtype=pixels.dtype.str,
        tokens=int(pre.tokens_per_image[0]),
        grids={key: np.asarray(value) for key, value in pre.grids.items()},
        patches=pre.patches_per_image,
        lut=pre.normalize_lut,
        decode_s=decode_s,
        preprocess_s=preprocess_s,
    )


def _processor(fingerprint: str, blob: bytes) -> ImageProcessor:
    processor = _PROCESSORS.get(fingerprint)
    if processor is None:
        # Our own gateway pickled it (gateway/multimodal/pool.py), over a private pipe.
        processor = pickle.loads(blob)
        if len(_PROCESSORS) >= _MAX_PROCESSORS:
            _PROCESSORS.pop(next(iter(_PROCESSORS)))
        _PROCESSORS[fingerprint] = processor
    return processor
