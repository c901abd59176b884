"""Router path, video half: fetch, hash, sample, decode and preprocess a request's videos.

Each video's container header is read first (frame count, rate, size), its frames are
sampled as the model's processor samples them, and the decode cost of those frames is
charged to the request's share of the in-flight budget **before** anything is decoded
(docs/operations.md, "Memory bounds for images"): a video that would decode past the
budget is refused having cost a header read. Decoding runs on the media pool
(media/executor.py), one video at a time, within the policy's decode caps, and stops at the
next frame once this request is given up (a timeout, a client gone).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tandem.errors import make_error
from tandem.gateway.multimodal.process import media_error_to_tandem
from tandem.media import MediaError, MediaPolicy, fetch_all, media_hash
from tandem.media.budget import ByteLease, run_in_thread_holding
from tandem.media.executor import run_media
from tandem.media.video import DecodeGuard
from tandem.models.info import ModelInfo
from tandem.models.video import QwenVideoProcessor, VideoRefused
from tandem.models.video_batch import VideoBatch, decode_video, join_videos, plan_video


@dataclass(slots=True)
class ProcessedVideos:
    """The processed videos of one request, in plan order, not yet on the wire."""

    batch: VideoBatch
    hashes: list[str]  # BLAKE3 hex of each video's encoded bytes
    fetch_s: float
    decode_s: float

    def __len__(self) -> int:
        return len(self.hashes)


async def process_videos(
    urls: list[str],
    info: ModelInfo,
    processor: QwenVideoProcessor,
    policy: MediaPolicy,
    encode: Callable[[str], Sequence[int]],
    *,
    lease: ByteLease | None = None,
) -> ProcessedVideos:
    """Fetch (concurrently, under the per-video byte cap), plan, charge, decode, join.

    Raises 400 ``media_url_refused``/``media_too_large``/``multimodal_processing_failed``
    as for images, 413/429 from the budget when the decoded frames would not fit.
    """
    if not urls:
        raise ValueError("process_videos needs at least one video")
    started = time.perf_counter()
    try:
        fetched = await fetch_all(urls, policy.for_video())
        fetch_s = time.perf_counter() - started
        blobs = [item.data for item in fetched]
        plans, hashes = await run_media(
            lambda: (
                [plan_video(blob, policy, processor) for blob in blobs],
                [media_hash(blob) for blob in blobs],
            )
        )
        decoding = None
        if lease is not None:
            # Every video's frames and patches, before any is decoded (413/429 here). The
            # frames' share is released when the decoding thread ends, also if this request
            # is given up meanwhile (the thread stops at its next frame, not at once); the
            # patches stay charged.
            total = sum(plan.nbytes for plan in plans)
            lease.hold(lease.nbytes + total)
            decoding = lease.split(total - sum(plan.patch_bytes for plan in plans))
        started = time.perf_counter()
        cancel = threading.Event()  # set if this request is given up while decoding

        def decode_all() -> VideoBatch:
            # Joined in the thread too: several videos' patches are one copy, off the loop.
            videos = [
                decode_video(blob, plan, processor, guard=DecodeGuard(policy, cancel))
                for blob, plan in zip(blobs, plans, strict=True)
            ]
            return join_videos(videos, info, encode)

        batch = await run_in_thread_holding(decoding, decode_all, cancel=cancel)
    except MediaError as exc:
        raise media_error_to_tandem(exc) from exc
    except VideoRefused as exc:
        raise make_error("multimodal_processing_failed", f"video refused: {exc}") from exc
    return ProcessedVideos(
        batch=batch,
        hashes=hashes,
        fetch_s=fetch_s,
        decode_s=time.perf_counter() - started,
    )
