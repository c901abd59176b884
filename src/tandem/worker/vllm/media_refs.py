"""Worker-side media (the ``media_refs`` path): fetch, decode, preprocess, expand — once.

The worker applies the same media policy as the gateway's router path (one
``MediaPolicy``, one SSRF guard), and produces the same tensors because both
use :mod:`tandem.models`' processor. After a prefill leg it also describes the
result as a pixel-free ``MediaIdentity`` so the decode leg need not redo it. Headers,
decoding and preprocessing run on the media pool (media/executor.py), never on asyncio's
default executor, which the media URLs' DNS look-ups need.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from tandem.engine.types import MediaInputs, MediaItem
from tandem.media import (
    MediaDecodeFailed,
    MediaError,
    MediaPolicy,
    check_scheme,
    decode_image,
    fetch_all,
    media_hash,
)
from tandem.media.budget import run_in_thread_holding
from tandem.media.executor import run_media
from tandem.media.video import DecodeGuard
from tandem.models.image_batch import decode_cost, preprocess_one_at_a_time
from tandem.models.info import ModelInfo
from tandem.models.placeholders import count_anchors, expand_media
from tandem.models.processor import ImageProcessor, PreprocessedImages
from tandem.models.video import PreprocessedVideo, QwenVideoProcessor, VideoRefused
from tandem.models.video_batch import VideoBatch, decode_video, join_videos, plan_video
from tandem.wire.proto import MediaIdentity, Modality, MultimodalInputs, pb
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
    video_token_id: int | None = None  # marks a video range's embeddings (its im_token_id)


_KINDS = {Modality.IMAGE: "image", Modality.MODALITY_UNSPECIFIED: "image", Modality.VIDEO: "video"}


class MediaRefsProcessor:
    def __init__(
        self,
        info: ModelInfo,
        processor: ImageProcessor,
        policy: MediaPolicy,
        limits: MediaRefsLimits | None = None,
        *,
        video: QwenVideoProcessor | None = None,
        encode: Callable[[str], Sequence[int]] | None = None,
    ) -> None:
        self.info = info
        self.processor = processor
        self.policy = policy
        # Items, requests at once and decoded bytes (worker/media_limits.py).
        self.limits = limits or MediaRefsLimits()
        # Video needs its processor and the tokenizer (its timestamps are text).
        self.video = video if info.takes_video and encode is not None else None
        self.encode = encode
        # In the stats: shows that media are processed once (docs/pd-contract.md §10).
        self.items_processed = 0

    def check(self, refs: pb.MediaRefs) -> list[tuple[str, str]]:
        """Validate the refs before anything is fetched (ValueError on a bad one);
        ``(modality, url)`` per item."""
        if not refs.items:
            raise ValueError("media_refs has no items")
        self.limits.check_items(len(refs.items))
        parts = []
        for index, item in enumerate(refs.items):
            kind = _KINDS.get(item.modality)
            if kind is None or (kind == "video" and self.video is None):
                name = Modality.Name(item.modality)
                takes = "images and videos" if self.video is not None else "images"
                raise ValueError(f"media_refs item {index} is {name}; this worker takes {takes}")
            if not item.url:
                raise ValueError(f"media_refs item {index} has an empty url")
            check_scheme(item.url, self.policy)
            parts.append((kind, item.url))
        return parts

    async def process(self, refs: pb.MediaRefs, input_ids: list[int]) -> ProcessedMedia:
        parts = self.check(refs)
        self.check_anchors(input_ids, parts)
        image_urls = [url for kind, url in parts if kind == "image"]
        video_urls = [url for kind, url in parts if kind == "video"]
        with self.limits.slot():  # UNAVAILABLE "worker is saturated" beyond --mm-max-inflight
            fetched_images, fetched_videos = await asyncio.gather(
                fetch_all(image_urls, self.policy), fetch_all(video_urls, self.policy.for_video())
            )
            pre = await self._decode_within_budget([f.data for f in fetched_images])
            videos = await self._videos_within_budget([f.data for f in fetched_videos])
        image_runs = [[self.info.image_token_id] * n for n in pre.tokens_per_image] if pre else []
        ids, image_ranges, video_ranges = expand_media(
            input_ids,
            self.info.anchor_token_id,
            image_runs,
            self.info.video_token_id,
            videos.replacements if videos else [],
        )
        self.items_processed += len(parts)
        items = [
            MediaItem(media_hash(f.data), offset, length)
            for f, (offset, length) in zip(fetched_images, image_ranges, strict=True)
        ] + [
            MediaItem(media_hash(f.data), offset, length, "video")
            for f, (offset, length) in zip(fetched_videos, video_ranges, strict=True)
        ]
        grids = dict(pre.grids) if pre else {}
        if videos is not None:
            grids["video_grid_thw"] = videos.grid
        media = MediaInputs(
            items=sorted(items, key=lambda item: item.offset),
            im_token_id=self.info.image_token_id if pre else None,
            pixel_values=pre.pixel_values if pre else None,
            grids=grids,
            video_pixel_values=videos.pixel_values if videos else None,
        )
        return ProcessedMedia(ids, media, self.info.video_token_id if videos else None)

    def check_anchors(self, input_ids: list[int], parts: list[tuple[str, str]]) -> None:
        """One unexpanded anchor per ref, checked before any fetch: a prompt that cannot pair
        its media with placeholders must not cost the worker any media traffic."""
        anchors_of = (("image", self.info.anchor_token_id), ("video", self.info.video_token_id))
        for kind, anchor in anchors_of:
            count = sum(1 for k, _ in parts if k == kind)
            anchors = count_anchors(input_ids, anchor) if anchor is not None else 0
            if anchors != count:
                raise AnchorMismatch(
                    f"the prompt has {anchors} {kind} placeholder token(s) (id {anchor}) but "
                    f"media_refs has {count} {kind} item(s); each {kind} needs exactly one "
                    "placeholder"
                )

    async def _decode_within_budget(self, blobs: list[bytes]) -> PreprocessedImages | None:
        """Charge the decode cost (from the headers) to the worker's budget, then decode one
        image at a time in a thread, keeping the charge until that thread is done."""
        if not blobs:
            return None
        cost = await run_media(decode_cost, blobs, self.policy, self.processor)
        lease = self.limits.budget.acquire(cost.total)  # 413, or UNAVAILABLE when saturated
        return await run_in_thread_holding(lease, lambda: self._decode_and_preprocess(blobs))

    def _decode_and_preprocess(self, blobs: list[bytes]) -> PreprocessedImages:
        target = self.processor.resize_target
        return preprocess_one_at_a_time(
            blobs, lambda blob: decode_image(blob, self.policy, target), self.processor
        )

    async def _videos_within_budget(self, blobs: list[bytes]) -> VideoBatch | None:
        """As for images: every video's decode cost from its header is charged first."""
        video, encode = self.video, self.encode
        if not blobs:
            return None
        assert video is not None and encode is not None  # check() refused videos otherwise
        try:
            plans = await run_media(
                lambda: [plan_video(blob, self.policy, video) for blob in blobs]
            )
        except VideoRefused as exc:
            raise MediaDecodeFailed(str(exc)) from exc
        lease = self.limits.budget.acquire(sum(plan.nbytes for plan in plans))
        cancel = threading.Event()  # set if the RPC ends (deadline, cancel) while decoding

        def decode_all() -> list[PreprocessedVideo]:
            return [
                decode_video(blob, plan, video, raw=False, guard=DecodeGuard(self.policy, cancel))
                for blob, plan in zip(blobs, plans, strict=True)
            ]

        decoded = await run_in_thread_holding(lease, decode_all, cancel=cancel)
        return join_videos(decoded, self.info, encode)


def build_media_identity(processed: ProcessedMedia) -> MediaIdentity:
    """The pixel-free description of processed media that a decode leg can be built from:
    the image batch first, then the video batch (``extra_mm_inputs`` when both exist)."""
    identity = MediaIdentity(prompt_token_ids=processed.prompt_ids)
    media = processed.media
    batches = []
    for kind, modality, key, token in (
        ("image", Modality.IMAGE, "image_grid_thw", media.im_token_id),
        ("video", Modality.VIDEO, "video_grid_thw", processed.video_token_id),
    ):
        items = media.of(kind)
        if not items:
            continue
        batch = MultimodalInputs(modality=modality)
        batch.mm_hashes.extend(item.mm_hash for item in items)
        for item in items:
            batch.mm_placeholders.add(offset=item.offset, length=item.length)
        if token is not None:
            batch.im_token_id = token
        grid = media.grids.get(key)
        if grid is not None:
            grid = np.asarray(grid)
            if grid.shape[0] != len(items):
                # Positions could not be rebuilt per item; the decode side must reprocess.
                raise ValueError(f"grid tensor {key} is not one row per item")
            batch.model_specific_tensors[key].CopyFrom(encode_tensor(grid))
            batch.batched_keys.append(key)
            batch.keep_on_cpu_keys.append(key)
        batches.append(batch)
    if batches:
        identity.mm_inputs.CopyFrom(batches[0])
        identity.extra_mm_inputs.extend(batches[1:])
    return identity
