"""Router path, media half: fetch, hash, decode and preprocess the images of a plan.

Fetching is I/O and runs concurrently on the event loop. Each image's encoded bytes are
hashed and its header read off the loop, on the media pool (media/executor.py, which keeps
asyncio's default executor free for DNS look-ups and tokenization); the hash and a
fingerprint of the processor key the per-image pixel cache (``--mm-pixel-cache-mb``,
gateway/multimodal/pixel_cache.py), and only the misses are decoded and preprocessed: in
the image pool's processes (``--mm-workers``, gateway/multimodal/pool.py), one image per
task so a request's images spread over the pool, or with ``--mm-workers 0`` in one thread
of the media pool, one image at a time (docs/pd-contract.md §4). Before any image is
decoded the request's decode cost (from the headers) is charged against the in-flight
budget (docs/operations.md, "Memory bounds for images").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx
import numpy as np

from tandem.errors import TandemError, make_error
from tandem.gateway.multimodal.misses import MediaTimings, MissWork, held_bytes
from tandem.gateway.multimodal.pixel_cache import CacheKey, OneImage, PixelCache
from tandem.gateway.multimodal.plan import MediaPlan
from tandem.gateway.multimodal.pool import ImagePool
from tandem.gateway.multimodal.pool_spec import processor_spec
from tandem.media import (
    MediaError,
    MediaPolicy,
    Resolver,
    fetch_all,
    media_hash,
)
from tandem.media.budget import ByteLease
from tandem.media.executor import run_media
from tandem.models.image_batch import DecodeCost, image_costs, join_pixels
from tandem.models.info import ModelInfo
from tandem.models.processor import ImageProcessor, PreprocessedImages

log = logging.getLogger("tandem.gateway.multimodal")

# Headers + BLAKE3 take ~0.08 ms for a 300 KB JPEG: below this many bytes they run on the
# loop, where a thread hop would cost more than the work (and a GIL hand-off each way).
_INLINE_HASH_BYTES = 1 << 20


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
    # Each item's bytes as fetched, in plan order, when the caller asked to keep them
    # (``keep_sources``: a protocol whose engine processes images itself); else None.
    sources: list[bytes] | None = None

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
    pool: ImagePool | None = None,
    cache: PixelCache | None = None,
    keep_sources: bool = False,
) -> ProcessedImages:
    """Fetch (concurrently), hash, then decode and preprocess every image not in ``cache``.

    ``client`` may be a shared client from ``tandem.media.make_client`` (connection reuse);
    without one, ``fetch_all`` makes a guarded client per call.
    ``lease`` (the request's, on the gateway's in-flight budget) is charged the decode cost
    before any image is decoded (413/429 from the budget), and holds only the pixel values'
    bytes once this returns, cache hits included.
    ``pool``: the gateway's image pool; None decodes in a thread of this process.
    ``cache``: the per-image pixel cache; None (or a cache of size 0) caches nothing.
    ``keep_sources``: keep each image's fetched bytes on the result (``sources``), cache
    hits included (every image is fetched and hashed whatever the cache holds).
    Raises a 400 ``TandemError``: ``media_url_refused`` (policy), ``media_too_large`` (byte
    or pixel caps) or ``multimodal_processing_failed`` (fetch, header, decode or
    preprocess); 500 ``multimodal_pool_process_died`` when a pool process died meanwhile.
    """
    if not plan.image_urls:
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
    blobs = [item.data for item in fetched]
    caching = cache is not None and cache.enabled
    try:
        # Raw uint8 pixels: a quarter of the float32 bytes while the request is in flight,
        # and what workers that normalize on device need; others get them normalized
        # (bit-exactly) when their leg is sent (PixelPayload.for_worker).
        if sum(len(blob) for blob in blobs) > _INLINE_HASH_BYTES:
            costs, hashes = await run_media(_costs_and_hashes, blobs, policy, processor)
        else:
            costs, hashes = _costs_and_hashes(blobs, policy, processor)
        spec = processor_spec(processor, info, policy, raw=True) if caching or pool else None
        keys: list[CacheKey] = [(h, spec.fingerprint if spec else "") for h in hashes]
        images: list[OneImage | None] = [
            cache.get(key) if caching and cache is not None else None for key in keys
        ]
        misses = [i for i, image in enumerate(images) if image is None]
        if misses:
            work = MissWork(blobs, misses, costs, processor, policy, timings)
            if pool is not None and spec is not None:
                made = await work.in_pool(pool, spec, lease, images)
            else:
                made = await work.in_thread(lease, images)
            for i, image in zip(misses, made, strict=True):
                images[i] = image
                if caching and cache is not None:
                    cache.put(keys[i], image)
        elif lease is not None:
            lease.hold(sum(held_bytes(image) for image in images))  # nothing will be decoded
        ready = [image for image in images if image is not None]
        preprocessed = await _joined(ready)
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
        sources=blobs if keep_sources else None,
    )


def _costs_and_hashes(
    blobs: Sequence[bytes], policy: MediaPolicy, processor: ImageProcessor
) -> tuple[list[DecodeCost], list[str]]:
    # Off the loop. The headers first: the pixel cap and malformed headers are refused
    # before anything else, cache hits included. Hashes are over the encoded bytes as
    # fetched, so they do not depend on the decoder (docs/pd-contract.md §4).
    costs = image_costs(blobs, policy, processor, raw=True)
    return costs, [media_hash(blob) for blob in blobs]


async def _joined(images: list[OneImage]) -> PreprocessedImages:
    """The request's batch, in plan order. Several images are copied into one array (off
    the loop): the only pixel copy on the gateway side; one image is used as it is."""
    pixels = [image.pixels for image in images]
    joined = pixels[0] if len(pixels) == 1 else await run_media(join_pixels, pixels)
    grids: dict[str, np.ndarray] = {}
    for key in images[0].grids:
        grids[key] = np.concatenate([image.grids[key] for image in images])
    patches = [image.patches for image in images if image.patches is not None]
    return PreprocessedImages(
        pixel_values=joined,
        tokens_per_image=[image.tokens for image in images],
        grids=grids,
        patches_per_image=np.concatenate(patches) if patches else None,
        normalize_lut=images[0].lut,
    )


def _check_batch(pre: PreprocessedImages, count: int) -> None:
    # A processor returning the wrong number of items would silently misalign images and
    # placeholders; that is a bug on our side, hence a 500 rather than a client error.
    if len(pre.tokens_per_image) != count:
        raise make_error(
            "internal_error",
            f"image processor returned {len(pre.tokens_per_image)} items for {count} images",
        )
