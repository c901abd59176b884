"""Worker-side media (the ``media_refs`` path): fetch, decode, preprocess, expand — once.

The worker applies the same media policy as the gateway's router path (one
``MediaPolicy``, one SSRF guard), and produces the same tensors because both
use :mod:`tandem.models`' processor. After a prefill leg it also describes the
result as a pixel-free ``MediaIdentity`` so the decode leg need not redo it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import numpy as np

from tandem.engine.types import MediaInputs, MediaItem
from tandem.media import (
    MediaError,
    MediaPolicy,
    check_scheme,
    decode_image,
    fetch_all,
    media_hash,
)
from tandem.media.budget import run_in_thread_holding
from tandem.models.image_batch import decode_cost, preprocess_one_at_a_time
from tandem.models.info import ModelInfo
from tandem.models.placeholders import count_anchors, expand_placeholders
from tandem.models.processor import ImageProcessor, PreprocessedImages
from tandem.wire.proto import MediaIdentity, Modality, pb
from tandem.wire.tensors import encode_tensor
from tandem.worker.media_limits import MediaRefsLimits


class AnchorMismatch(MediaError):
    """The refs and the prompt's anchors do not pair up (a client error, never retried).

    A ``MediaError`` so that the servicer refuses it like refused media: INVALID_ARGUMENT
    with this code in the trailing metadata, the code the gateway itself uses.
    """

    code = "multimodal_prompt_contract_mismatch"


@dataclass(slots=True)
class ProcessedMedia:
    prompt_ids: list[int]  # expanded
    media: MediaInputs


class MediaRefsProcessor:
    def __init__(
        self,
        info: ModelInfo,
        processor: ImageProcessor,
        policy: MediaPolicy,
        limits: MediaRefsLimits | None = None,
    ) -> None:
        self.info = info
        self.processor = processor
        self.policy = policy
        # Items, requests at once and decoded bytes (worker/media_limits.py).
        self.limits = limits or MediaRefsLimits()
        # In the stats: shows that media are processed once (docs/pd-contract.md §10).
        self.items_processed = 0

    def check(self, refs: pb.MediaRefs) -> list[str]:
        """Validate the refs before anything is fetched (ValueError on a bad one)."""
        if not refs.items:
            raise ValueError("media_refs has no items")
        self.limits.check_items(len(refs.items))
        urls = []
        for index, item in enumerate(refs.items):
            if item.modality not in (Modality.IMAGE, Modality.MODALITY_UNSPECIFIED):
                name = Modality.Name(item.modality)
                raise ValueError(f"media_refs item {index} is {name}; this worker takes images")
            if not item.url:
                raise ValueError(f"media_refs item {index} has an empty url")
            check_scheme(item.url, self.policy)
            urls.append(item.url)
        return urls

    async def process(self, refs: pb.MediaRefs, input_ids: list[int]) -> ProcessedMedia:
        urls = self.check(refs)
        self.check_anchors(input_ids, len(urls))
        with self.limits.slot():  # UNAVAILABLE "worker is saturated" beyond --mm-max-inflight
            fetched = await fetch_all(urls, self.policy)
            pre = await self._decode_within_budget([f.data for f in fetched])
        ids, ranges = expand_placeholders(
            input_ids, self.info.anchor_token_id, pre.tokens_per_image, self.info.image_token_id
        )
        self.items_processed += len(fetched)
        items = [
            MediaItem(media_hash(f.data), offset, length)
            for f, (offset, length) in zip(fetched, ranges, strict=True)
        ]
        media = MediaInputs(
            items=items,
            im_token_id=self.info.image_token_id,
            pixel_values=pre.pixel_values,
            grids=dict(pre.grids),
        )
        return ProcessedMedia(ids, media)

    def check_anchors(self, input_ids: list[int], count: int) -> None:
        """One unexpanded anchor per ref, checked before any fetch: a prompt that cannot pair
        its images with placeholders must not cost the worker any media traffic."""
        anchors = count_anchors(input_ids, self.info.anchor_token_id)
        if anchors != count:
            raise AnchorMismatch(
                f"the prompt has {anchors} image placeholder token(s) (id "
                f"{self.info.anchor_token_id}) but media_refs has {count} item(s); each image "
                "needs exactly one placeholder"
            )

    async def _decode_within_budget(self, blobs: list[bytes]) -> PreprocessedImages:
        """Charge the decode cost (from the headers) to the worker's budget, then decode one
        image at a time in a thread, keeping the charge until that thread is done."""
        cost = await asyncio.to_thread(decode_cost, blobs, self.policy, self.processor)
        lease = self.limits.budget.acquire(cost.total)  # 413, or UNAVAILABLE when saturated
        return await run_in_thread_holding(lease, lambda: self._decode_and_preprocess(blobs))

    def _decode_and_preprocess(self, blobs: list[bytes]) -> PreprocessedImages:
        target = self.processor.resize_target
        return preprocess_one_at_a_time(
            blobs, lambda blob: decode_image(blob, self.policy, target), self.processor
        )


def build_media_identity(processed: ProcessedMedia, grid_keys: tuple[str, ...]) -> MediaIdentity:
    """The pixel-free description of processed media that a decode leg can be built from."""
    identity = MediaIdentity(prompt_token_ids=processed.prompt_ids)
    batch = identity.mm_inputs
    batch.modality = Modality.IMAGE
    media = processed.media
    batch.mm_hashes.extend(item.mm_hash for item in media.items)
    for item in media.items:
        batch.mm_placeholders.add(offset=item.offset, length=item.length)
    if media.im_token_id is not None:
        batch.im_token_id = media.im_token_id
    for key in grid_keys:
        grid = media.grids.get(key)
        if grid is None:
            continue
        grid = np.asarray(grid)
        if grid.shape[0] != len(media.items):
            # Positions could not be rebuilt per item; the decode side must reprocess.
            raise ValueError(f"grid tensor {key} is not one row per item")
        batch.model_specific_tensors[key].CopyFrom(encode_tensor(grid))
        batch.batched_keys.append(key)
        batch.keep_on_cpu_keys.append(key)
    return identity
