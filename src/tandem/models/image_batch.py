"""A request's images, decoded and preprocessed one at a time, with the cost known up front.

Decoding every image of a request before preprocessing any holds all their decoded frames
at once (eight 8192x8192 images are 2 GiB in Pillow). Here each image is decoded,
preprocessed and freed before the next one is decoded, so a request holds at most one
decoded image plus the pixel values made so far; :func:`decode_cost` says how much that is,
from the headers alone, so a budget can be charged before anything is decoded
(docs/operations.md, "Memory bounds for images"). The router path (gateway) and the
``media_refs`` path (worker) both go through here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image

from tandem.media.header import read_image_header
from tandem.media.policy import MediaPolicy
from tandem.models.processor import ImageProcessor, PreprocessedImages

_RGB_BYTES = 4  # Pillow keeps an RGB pixel in four bytes


@dataclass(frozen=True, slots=True)
class DecodeCost:
    """Peak bytes of decoding and preprocessing a request's images one at a time."""

    working: int  # the largest single image: decoded frame plus its preprocessing
    outputs: int  # the pixel values of every image (0 for images whose size is unknown)

    @property
    def total(self) -> int:
        return self.working + self.outputs


def decode_cost(
    blobs: Sequence[bytes], policy: MediaPolicy, processor: ImageProcessor, raw: bool = False
) -> DecodeCost:
    """Read every header (nothing is decoded) and estimate the request's peak.

    The pixel cap and malformed headers are refused here, as ``MediaError``, so a bad
    fifth image costs no decoding of the first four. ``raw``: as for ``preprocess``.
    """
    costs = image_costs(blobs, policy, processor, raw)
    return DecodeCost(max(c.working for c in costs), sum(c.outputs for c in costs))


def image_costs(
    blobs: Sequence[bytes], policy: MediaPolicy, processor: ImageProcessor, raw: bool = False
) -> list[DecodeCost]:
    """:func:`decode_cost` of each image on its own, in order (same refusals)."""
    if not blobs:
        raise ValueError("no images to cost")
    costs: list[DecodeCost] = []
    for blob in blobs:
        header = read_image_header(blob, policy)
        out = processor.output_nbytes(header.width, header.height, raw) or 0
        # Pillow resizes in two passes, the horizontal one first: its scratch image is the
        # target width by the source height. The layout copies are about one more output.
        target = processor.resize_target(header.width, header.height)
        scratch = target[0] * header.height * _RGB_BYTES if target else 0
        costs.append(DecodeCost(header.decoded_bytes + scratch + out, out))
    return costs


def preprocess_one_at_a_time(
    blobs: Sequence[bytes],
    decode: Callable[[bytes], Image.Image],
    processor: ImageProcessor,
    raw: bool = False,
) -> PreprocessedImages:
    """Decode, preprocess and free each image in turn; the same arrays as one batch call.

    Every processor works image by image (resize, normalize, patchify), so the per-image
    results, joined in order, are what ``processor.preprocess(all_images)`` returns.
    """
    if not blobs:
        raise ValueError("no images to preprocess")
    pixels: list[np.ndarray] = []
    tokens: list[int] = []
    grids: dict[str, list[np.ndarray]] = {}
    patches: list[np.ndarray] = []
    lut: np.ndarray | None = None
    for blob in blobs:
        image = decode(blob)
        try:
            one = processor.preprocess([image], raw=raw)
        finally:
            image.close()
        del image  # the decoded frame is gone before the next one is decoded
        pixels.append(one.pixel_values)
        tokens.extend(one.tokens_per_image)
        for key, value in one.grids.items():
            grids.setdefault(key, []).append(np.asarray(value))
        if one.patches_per_image is not None:
            patches.append(one.patches_per_image)
        lut = one.normalize_lut
        del one
    return PreprocessedImages(
        pixel_values=join_pixels(pixels),
        tokens_per_image=tokens,
        grids={key: np.concatenate(values) for key, values in grids.items()},
        patches_per_image=np.concatenate(patches) if patches else None,
        normalize_lut=lut,
    )


def join_pixels(parts: list[np.ndarray]) -> np.ndarray:
    """Concatenate along the first axis, freeing each part once copied (``parts`` is
    emptied); a single part is returned as it is, without a copy.

    ``np.empty`` only reserves the result; its pages are touched as parts are copied in,
    and each part is dropped right after, so the peak stays near one copy of the pixels.
    """
    if len(parts) == 1:
        return parts.pop()
    tail = parts[0].shape[1:]
    if any(part.shape[1:] != tail or part.dtype != parts[0].dtype for part in parts):
        shapes = ", ".join(str(part.shape) for part in parts)
        raise ValueError(f"images of different sizes cannot be batched: {shapes}")
    out = np.empty((sum(part.shape[0] for part in parts), *tail), dtype=parts[0].dtype)
    start = 0
    parts.reverse()  # pop from the end, in request order
    while parts:
        part = parts.pop()
        out[start : start + part.shape[0]] = part
        start += part.shape[0]
        del part
    return out
