"""A request's videos, from fetched bytes to one batch: the steps both media paths share.

The gateway (router path) and the worker (``media_refs`` path) each: read every video's
header and sample its frames (:func:`plan_video`, cheap, no pixels), charge the decode cost
to their memory budget, then decode and preprocess (:func:`decode_video`) and join the
videos into one batch (:func:`join_videos`). Same code, so the same bytes give the same
tensors and tokens on either path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from tandem.media.errors import MediaDecodeFailed
from tandem.media.policy import MediaPolicy
from tandem.media.video import DecodeGuard, VideoHeader, decode_frames, probe_video
from tandem.models.info import ModelInfo
from tandem.models.video import (
    PreprocessedVideo,
    QwenVideoProcessor,
    VideoRefused,
    VideoSampling,
    video_replacement,
)


@dataclass(frozen=True, slots=True)
class VideoPlan:
    """One video before decoding: its header, the frames to decode and what that costs."""

    header: VideoHeader
    sampling: VideoSampling
    nbytes: int  # decoded frames + patches, charged before decoding
    patch_bytes: int  # of which the patches (raw uint8), held until they are sent


@dataclass(slots=True)
class VideoBatch:
    """The videos of one request, in prompt order, as one flat patch array."""

    pixel_values: np.ndarray  # [sum t*h*w, C*T*P*P], raw uint8 when normalize_lut is set
    grid: np.ndarray  # int64 [n, 3] video_grid_thw
    replacements: list[list[int]]  # the token ids each video's anchor becomes
    normalize_lut: np.ndarray | None

    def __len__(self) -> int:
        return len(self.replacements)

    @property
    def patches_per_video(self) -> np.ndarray:
        return self.grid.prod(axis=1).astype(np.int64)


def plan_video(blob: bytes, policy: MediaPolicy, processor: QwenVideoProcessor) -> VideoPlan:
    """Header, sampling and decode cost of one video; MediaError/VideoRefused if refused."""
    header = probe_video(blob, policy)
    sampling = processor.sample_frames(
        header.frames, header.fps, policy.video_fps, policy.max_video_frames
    )
    count = len(sampling.indices)
    nbytes = processor.decode_nbytes(count, header.width, header.height)
    patches = processor.output_nbytes(count, header.width, header.height)
    return VideoPlan(header, sampling, nbytes, patches)


def decode_video(
    blob: bytes,
    plan: VideoPlan,
    processor: QwenVideoProcessor,
    raw: bool = True,
    guard: DecodeGuard | None = None,
) -> PreprocessedVideo:
    """Decode the sampled frames and preprocess them (CPU-bound: run it off the loop).

    ``guard``: this video's decode caps and its request's cancellation (media/video.py).
    """
    frames = decode_frames(blob, plan.sampling.indices, plan.header, guard)
    try:
        return processor.preprocess(frames, plan.sampling, raw=raw)
    except VideoRefused as exc:
        raise MediaDecodeFailed(f"video preprocessing failed: {exc}") from exc


def join_videos(
    videos: Sequence[PreprocessedVideo], info: ModelInfo, encode: Callable[[str], Sequence[int]]
) -> VideoBatch:
    """One batch of the videos, in order, with each one's prompt replacement."""
    if not videos:
        raise ValueError("no videos to join")
    if info.video_token_id is None or info.vision_start_id is None or info.vision_end_id is None:
        raise ValueError(f"model family {info.family.name} takes no video")
    pixels = [video.pixel_values for video in videos]
    joined = pixels[0] if len(pixels) == 1 else np.concatenate(pixels)
    replacements = [
        video_replacement(
            video, encode, info.vision_start_id, info.vision_end_id, info.video_token_id
        )
        for video in videos
    ]
    return VideoBatch(
        pixel_values=joined,
        grid=np.concatenate([video.grid for video in videos]),
        replacements=replacements,
        normalize_lut=videos[0].normalize_lut,
    )
