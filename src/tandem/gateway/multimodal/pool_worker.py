"""What runs inside an image pool process: decode and preprocess one image.

The forkserver preloads it (pool_preload.py, which blocks torch first), so every pool
process forked from the server starts with numpy, Pillow and this module imported.

The same :func:`decode_and_preprocess` serves ``--mm-workers 0`` in the gateway's own
thread, so both modes give the same bits.
"""

from __future__ import annotations

import os
import pickle
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection

import numpy as np
from PIL import Image

from tandem.gateway.multimodal.pixel_segments import write_segment
from tandem.media import MediaError, MediaPolicy, decode_image
from tandem.models.image_batch import preprocess_one_at_a_time
from tandem.models.processor import ImageProcessor, PreprocessedImages

# Processors by fingerprint, kept for the process's life: the gateway sends each one once
# per process (a few KiB each; a gateway serves one model, a reload adds one).
_PROCESSORS: dict[str, ImageProcessor] = {}


@dataclass(frozen=True, slots=True)
class ImageTask:
    """One image for a pool process.

    ``processor`` is the pickled ImageProcessor, sent only with a process's first task of
    that fingerprint (None after). The image's bytes are in the file ``source``, which the
    pool process removes once read; the pixels go to the new file ``segment``. The gateway
    names both, so it can remove them whatever happens to the process.
    """

    fingerprint: str
    processor: bytes | None
    source: str
    policy: MediaPolicy
    raw: bool
    segment: str


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


@dataclass(frozen=True, slots=True)
class ImageCrashed:
    """Anything else raised while processing the image (a bug, MemoryError): a 500."""

    message: str


@dataclass(frozen=True, slots=True)
class WarmUp:
    """A pool process's first message; the answer says whether torch got loaded (a bug)."""


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


def serve(conn: Connection, nice: int = 0) -> None:
    """A pool process's whole life: answer each ``(id, message)`` frame, until EOF.

    ``nice`` lowers the process's CPU priority (``--mm-workers-nice``): where it shares a
    CPU with the event loop, the loop then runs as soon as it has tokens to relay instead
    of waiting out the pool process's time slice (≈ 3 ms here, the whole text ITL p99).

    The gateway's event loop writes and reads the other end of ``conn`` itself (no threads
    on its side, gateway/multimodal/pool_process.py), one frame per message, in this
    Connection's framing.
    """
    if nice:
        os.nice(nice)
    while True:
        try:
            frame = conn.recv_bytes()
        except (EOFError, OSError):
            return  # the gateway closed its end or is gone
        # Our own gateway pickled it, over a private socket pair.
        task_id, message = pickle.loads(frame)
        answer: object
        if isinstance(message, WarmUp):
            answer = warm()
        else:
            try:
                answer = run_task(message)
            except Exception as exc:  # reported to the gateway, not lost in this process
                answer = ImageCrashed(f"{type(exc).__name__}: {exc}")
        conn.send_bytes(pickle.dumps((task_id, answer), protocol=pickle.HIGHEST_PROTOCOL))


def run_task(task: ImageTask) -> ImageDone | ImageFailed:
    processor = _processor(task.fingerprint, task.processor)
    data = _take_source(task.source)
    try:
        pre, decode_s, preprocess_s = decode_and_preprocess(data, processor, task.policy, task.raw)
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


def _take_source(path: str) -> bytes:
    """The image's bytes from the gateway's file, which is removed at once."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        os.unlink(path)
        with open(fd, "rb", closefd=False) as source:
            return source.read()
    finally:
        os.close(fd)


def _processor(fingerprint: str, blob: bytes | None) -> ImageProcessor:
    processor = _PROCESSORS.get(fingerprint)
    if processor is None:
        if blob is None:
            raise RuntimeError(f"processor {fingerprint} was never sent to this process")
        # Our own gateway pickled it (gateway/multimodal/pool.py), over a private socket pair.
        processor = pickle.loads(blob)
        _PROCESSORS[fingerprint] = processor
    return processor
