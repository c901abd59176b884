"""Router path, media half: fetch, decode, preprocess and hash the images of a plan.

Fetching is I/O and runs concurrently on the event loop; decoding, hashing and
preprocessing are CPU-bound and run together in one worker thread so the gateway keeps
serving other requests meanwhile (docs/pd-contract.md §4). Before that thread
starts, the request's decode cost (read from the image headers) is charged against the
in-flight budget, and the images are decoded one at a time (docs/operations.md, "Memory
bounds for images").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx
import numpy as np
from PIL import Image

from tandem.errors import TandemError, make_error
from tandem.gateway.multimodal.plan import MediaPlan
from tandem.media import (
    FetchedMedia,
    MediaError,
    MediaPolicy,
    Resolver,
    decode_image,
    fetch_all,
    media_hash,
)
from tandem.media.budget import ByteLease, run_in_thread_holding
from tandem.models.image_batch import decode_cost, preprocess_one_at_a_time
from tandem.models.info import ModelInfo
from tandem.models.processor import ImageProcessor, PreprocessedImages

log = logging.getLogger("tandem.gateway.multimodal")


@dataclass(slots=True)
class MediaTimings:
    """Seconds spent per stage, for the gateway's metrics and timing logs."""

    fetch_s: float = 0.0
    decode_s: float = 0.0
    preprocess_s: float = 0.0


@dataclass(slots=True)
class ProcessedImages:
    """The processed images of one request, in plan order, not yet on the wire.

    ``pixel_values`` is released (set to None) by the assembler once it is encoded, so the
    gateway never holds the pixels twice for the rest of the request (pixels exist once).
    """

    pixel_values: np.ndarray | None  # raw uint8 when normalize_lut is set
    tokens_per_image: list[int]
    grids: dict[str, np.ndarray]  # e.g. image_grid_thw, int64 [n, 3]
    patches_per_image: np.ndarray | None  # int64 [n] for flat pixel layouts, else None
    hashes: list[str]  # BLAKE3 hex of each item's encoded bytes
    encoded_bytes: list[int]  # size of each item as fetched
    timings: MediaTimings = field(default_factory=MediaTimings)
    normalize_lut: np.ndarray | None = None  # see PreprocessedImages.normalize_lut

    def __len__(self) -> int:
        return len(self.tokens_per_image)

    def take_pixels(self) -> np.ndarray:
        """Hand the pixel array over to the caller and drop this object's reference."""
        if self.pixel_values is None:
            raise RuntimeError("the pixel values of these images were already assembled")
        pixels, self.pixel_values = self.pixel_values, None
        return pixels


def media_error_to_tandem(exc: MediaError) -> TandemError:
    """The client-facing 400 of a media failure; the media package's code is kept.

    Fetch failures stay 400 even when transient (docs/pd-contract.md §4): the
    request names the media, so a retry on another worker pair would fetch it again.
    """
    return make_error(exc.code, exc.message)


async def process_images(
    plan: MediaPlan,
    info: ModelInfo,
    processor: ImageProcessor,
    policy: MediaPolicy,
    *,
    client: httpx.AsyncClient | None = None,
    resolver: Resolver | None = None,
    lease: ByteLease | None = None,
) -> ProcessedImages:
    """Fetch (concurrently), then decode, preprocess and hash every image, one at a time.

    ``client`` may be a shared client from ``tandem.media.make_client`` (connection reuse);
    without one, ``fetch_all`` makes a guarded client per call.
    ``lease`` (the request's, on the gateway's in-flight budget) is charged the decode cost
    before any image is decoded (413/429 from the budget), and holds only the pixel values'
    bytes once this returns.
    Raises a 400 ``TandemError``: ``media_url_refused`` (policy), ``media_too_large`` (byte
    or pixel caps) or ``multimodal_processing_failed`` (fetch, header, decode or preprocess).
    """
    if plan.is_empty:
        raise ValueError("process_images needs a plan with at least one image")
    if processor.family != info.family:
        raise ValueError(
            f"processor is for family {processor.family.name!r}, model is {info.family.name!r}"
        )
    timings = MediaTimings()
    started = time.perf_counter()
    try:
        fetched = await fetch_all(plan.image_urls, policy, client=client, resolver=resolver)
    except MediaError as exc:
        raise media_error_to_tandem(exc) from exc
    timings.fetch_s = time.perf_counter() - started
    try:
        blobs = [item.data for item in fetched]
        cost = await asyncio.to_thread(decode_cost, blobs, policy, processor, raw=True)
        decoding = None
        if lease is not None:
            lease.hold(cost.total)  # refused (413/429) before a single pixel is decoded
            # The decoded frames' share stays charged until the thread is done with them,
            # even if this request is cancelled meanwhile; the rest is the pixel values'.
            decoding = lease.split(cost.working)
        preprocessed, hashes = await run_in_thread_holding(
            decoding, lambda: _decode_preprocess_hash(fetched, processor, policy, timings)
        )
    except MediaError as exc:
        raise media_error_to_tandem(exc) from exc
    except ValueError as exc:
        # transformers' processors raise ValueError for images they cannot resize (e.g. an
        # extreme aspect ratio); that is the client's image, not a gateway fault.
        log.info("image preprocessing refused the request's images: %s", exc)
        raise make_error(
            "multimodal_processing_failed", f"image preprocessing failed: {exc}"
        ) from exc
    _check_batch(preprocessed, len(plan))
    if lease is not None:
        lease.hold(preprocessed.pixel_values.nbytes)  # held until the pixels are sent
    return ProcessedImages(
        pixel_values=preprocessed.pixel_values,
        tokens_per_image=list(preprocessed.tokens_per_image),
        grids=dict(preprocessed.grids),
        patches_per_image=preprocessed.patches_per_image,
        hashes=hashes,
        encoded_bytes=[len(f.data) for f in fetched],
        timings=timings,
        normalize_lut=preprocessed.normalize_lut,
    )


def _decode_preprocess_hash(
    fetched: Sequence[FetchedMedia],
    processor: ImageProcessor,
    policy: MediaPolicy,
    timings: MediaTimings,
) -> tuple[PreprocessedImages, list[str]]:
    # Runs in a worker thread. Hashes are over the encoded bytes as fetched, so they do not
    # depend on the decoder (docs/pd-contract.md §4); they are computed here only to keep CPU
    # work off the event loop.
    hashes = [media_hash(item.data) for item in fetched]
    decode_s = 0.0

    def decode(data: bytes) -> Image.Image:
        nonlocal decode_s
        began = time.perf_counter()
        image = decode_image(data, policy, processor.resize_target)
        decode_s += time.perf_counter() - began
        return image

    started = time.perf_counter()
    # One image decoded at a time (see decode_cost). Raw uint8 pixels: a quarter of the
    # float32 bytes while the request is in flight, and what workers that normalize on
    # device need; others get them normalized (bit-exactly) when their leg is sent
    # (PixelPayload.for_worker).
    preprocessed = preprocess_one_at_a_time(
        [item.data for item in fetched], decode, processor, raw=True
    )
    timings.decode_s = decode_s
    timings.preprocess_s = time.perf_counter() - started - decode_s
    return preprocessed, hashes


def _check_batch(pre: PreprocessedImages, count: int) -> None:
    # A processor returning the wrong number of items would silently misalign images and
    # placeholders; that is a bug on our side, hence a 500 rather than a client error.
    if len(pre.tokens_per_image) != count:
        raise make_error(
            "internal_error",
            f"image processor returned {len(pre.tokens_per_image)} items for {count} images",
        )
