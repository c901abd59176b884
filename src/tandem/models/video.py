"""Qwen3-VL video preprocessing without torch: frame sampling, resize, patches and prompt.

transformers' ``Qwen3VLVideoProcessor`` needs torch and torchvision, which the gateway does
not load, so this module is the documented reference Tandem computes
(docs/pd-contract.md §4, "Video"):

- **Sampling** (``sample_frames``): ``n = int(total / source_fps * fps)``, clamped to
  ``[min_frames, max_frames]`` and to ``total``; the indices are
  ``linspace(0, total - 1, n)`` rounded. A source without a frame rate counts as 24 fps.
- **Resize**: the video ``smart_resize`` (pixels counted over all sampled frames), every
  frame resized with Pillow's filter of the processor's ``resample`` (bicubic). torchvision's
  antialiased bicubic, which transformers uses, can differ from it by one level in a few
  pixels; where no resize is needed (frames already on the patch grid) the two agree bit
  for bit.
- **Normalize**: transformers' fused form, in float32: ``(x - mean/rescale) / (std/rescale)``,
  as a lookup table per channel (raw uint8 pixels travel until a leg is sent, as for images).
- **Patches**: pairs of frames (``temporal_patch_size``), the last frame repeated for an odd
  count, merge-ordered like the image patches; ``video_grid_thw = (pairs, h/P, w/P)``.
- **Prompt**: per pair, ``<{t:.1f} seconds>`` then ``<|vision_start|>``, the pair's
  ``<|video_pad|>`` run and ``<|vision_end|>``, with ``t`` the mean of the pair's first and
  last timestamps; the run replaces the template's single ``<|video_pad|>`` anchor.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

_CHANNELS = 3
# Qwen3VLVideoProcessor's class defaults, for keys a checkpoint's config leaves out.
_DEFAULTS: dict[str, Any] = {
    "size": {"shortest_edge": 128 * 32 * 32, "longest_edge": 32 * 32 * 768},
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "min_frames": 4,
    "max_frames": 768,
    "fps": 2,
    "resample": 3,  # bicubic
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "cap_pixels_per_frame": False,
    "max_video_tokens": 768,
}
_UNKNOWN_SOURCE_FPS = 24.0


class VideoRefused(ValueError):
    """The video cannot be preprocessed (too few frames, an extreme aspect ratio)."""


@dataclass(frozen=True, slots=True)
class VideoSampling:
    indices: list[int]  # frames to decode, ascending
    source_fps: float  # the rate timestamps are computed with


@dataclass(slots=True)
class PreprocessedVideo:
    """One video's encoder input: ``[t*h*w, C*T*P*P]`` (raw uint8 or float32)."""

    pixel_values: np.ndarray
    grid: np.ndarray  # int64 [1, 3]: (t, h, w) in patches
    tokens_per_frame: int  # video tokens of each temporal patch
    timestamps: list[float]  # seconds, one per temporal patch
    normalize_lut: np.ndarray | None = None  # set when pixel_values are raw uint8

    @property
    def tokens(self) -> int:
        return self.tokens_per_frame * int(self.grid[0, 0])


def read_video_config(model_dir: Path) -> dict[str, Any]:
    """The video processor's settings, looked up where transformers looks (in its order)."""
    found: dict[str, Any] = {}
    nested = model_dir / "processor_config.json"
    if nested.exists():
        found = dict(json.loads(nested.read_text(encoding="utf-8")).get("video_processor") or {})
    for name in ("video_preprocessor_config.json", "preprocessor_config.json"):
        if found:
            break
        path = model_dir / name
        if path.exists():
            found = json.loads(path.read_text(encoding="utf-8"))
    return {**_DEFAULTS, **{k: v for k, v in found.items() if v is not None}}


def fused_value_lut(config: Mapping[str, Any]) -> np.ndarray:
    """float32 ``[3, 256]``: each uint8 value after transformers' fused rescale + normalize.

    Same float32 steps as its torch code: mean and std divided by the rescale factor (as a
    float32 product with ``1 / factor``), then ``(x - mean) / std``.
    """
    x = np.tile(np.arange(256, dtype=np.float32), (_CHANNELS, 1))
    mean = np.asarray(config["image_mean"], dtype=np.float32).reshape(-1)
    std = np.asarray(config["image_std"], dtype=np.float32).reshape(-1)
    if mean.size == 1:
        mean, std = np.repeat(mean, _CHANNELS), np.repeat(std, _CHANNELS)
    scale = np.float32(1.0 / config["rescale_factor"])
    if config["do_normalize"]:
        if config["do_rescale"]:
            mean, std = mean * scale, std * scale
        lut = (x - mean[:, None]) / std[:, None]
    elif config["do_rescale"]:
        lut = x * np.float32(config["rescale_factor"])
    else:
        lut = x
    lut = np.ascontiguousarray(lut, dtype=np.float32)
    lut.setflags(write=False)
    return lut


def smart_resize(
    frames: int, height: int, width: int, temporal: int, factor: int, lo: int, hi: int
) -> tuple[int, int]:
    """(height, width) on the ``factor`` grid with ``frames * h * w`` within ``[lo, hi]``."""
    if frames < temporal:
        raise VideoRefused(f"a video needs at least {temporal} frames; this one gives {frames}")
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > 200:
        raise VideoRefused(f"video aspect ratio {width}x{height} is over 200:1")
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    t_bar = round(frames / temporal) * temporal
    if t_bar * h_bar * w_bar > hi:
        beta = math.sqrt(frames * height * width / hi)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < lo:
        beta = math.sqrt(lo / (frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


class QwenVideoProcessor:
    """Frames of one video → Qwen3-VL encoder input, grid, timestamps and prompt tokens."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.patch = int(config["patch_size"])
        self.temporal = int(config["temporal_patch_size"])
        self.merge = int(config["merge_size"])
        size = config["size"]
        self.min_pixels, self.max_pixels = int(size["shortest_edge"]), int(size["longest_edge"])
        self.fps = float(config["fps"])
        self.min_frames, self.max_frames = int(config["min_frames"]), int(config["max_frames"])
        self.cap_per_frame = bool(config["cap_pixels_per_frame"])
        self.max_video_tokens = int(config["max_video_tokens"])
        self.resample = int(config["resample"])
        self.lut = fused_value_lut(config)

    @classmethod
    def from_model_dir(cls, model_dir: str | Path) -> QwenVideoProcessor:
        return cls(read_video_config(Path(model_dir)))

    def sample_frames(
        self, total: int, source_fps: float, fps: float | None = None, max_frames: int | None = None
    ) -> VideoSampling:
        """Which of ``total`` frames to decode; ``fps``/``max_frames`` override the config's."""
        if total < 1:
            raise VideoRefused("the video has no frames")
        rate = source_fps if source_fps > 0 else _UNKNOWN_SOURCE_FPS
        target = self.fps if fps is None else fps
        cap = self.max_frames if max_frames is None else min(self.max_frames, max_frames)
        count = int(total / rate * target)
        count = min(max(count, self.min_frames), cap, total)
        indices = np.linspace(0, total - 1, count).round().astype(int).tolist()
        return VideoSampling(indices, rate)

    def resize_target(self, frames: int, width: int, height: int) -> tuple[int, int]:
        """(width, height) every sampled frame is resized to."""
        factor = self.patch * self.merge
        hi = self.max_pixels
        if self.cap_per_frame:
            per_frame = min(self.max_video_tokens * factor * factor, self.max_pixels // frames)
            hi = max(per_frame, int(self.min_pixels * 1.05)) * frames
        h, w = smart_resize(frames, height, width, self.temporal, factor, self.min_pixels, hi)
        return w, h

    def output_nbytes(self, frames: int, width: int, height: int, raw: bool = True) -> int:
        """Bytes of ``pixel_values`` for ``frames`` sampled frames of this size."""
        w, h = self.resize_target(frames, width, height)
        padded = frames + (-frames % self.temporal)
        return padded * _CHANNELS * w * h * (1 if raw else 4)

    def decode_nbytes(self, frames: int, width: int, height: int) -> int:
        """Peak bytes of one video in flight: its decoded RGB frames plus its patches."""
        return frames * width * height * _CHANNELS + self.output_nbytes(frames, width, height)

    def preprocess(
        self, frames: np.ndarray, sampling: VideoSampling, raw: bool = True
    ) -> PreprocessedVideo:
        """``frames``: RGB uint8 ``[n, H, W, 3]``, the frames at ``sampling.indices``."""
        count, height, width = frames.shape[:3]
        if count != len(sampling.indices):
            raise ValueError(f"{count} frames for {len(sampling.indices)} sampled indices")
        w, h = self.resize_target(count, width, height)
        p, m, t = self.patch, self.merge, self.temporal
        pad = -count % t
        resized = np.empty((count + pad, h, w, _CHANNELS), dtype=np.uint8)
        for k in range(count):
            if (w, h) == (width, height):
                resized[k] = frames[k]
            else:
                image = Image.fromarray(frames[k]).resize((w, h), resample=self.resample)
                resized[k] = np.asarray(image)
        resized[count:] = resized[count - 1]  # an odd count repeats its last frame
        gt, gh, gw = (count + pad) // t, h // p, w // p
        blocks = resized.reshape(gt, t, gh // m, m, p, gw // m, m, p, _CHANNELS)
        # (t-patch, rows/m, cols/m, m_row, m_col, C, T, P, P): the merger's token order.
        blocks = blocks.transpose(0, 2, 5, 3, 6, 8, 1, 4, 7)
        patches = np.ascontiguousarray(blocks).reshape(gt * gh * gw, _CHANNELS * t * p * p)
        if not raw:
            from tandem.wire.pixels import normalize_raw

            patches = normalize_raw(patches, self.lut)
        return PreprocessedVideo(
            pixel_values=patches,
            grid=np.array([[gt, gh, gw]], dtype=np.int64),
            tokens_per_frame=gh * gw // (m * m),
            timestamps=self.timestamps(sampling),
            normalize_lut=self.lut if raw else None,
        )

    def timestamps(self, sampling: VideoSampling) -> list[float]:
        """Seconds of each temporal patch: the mean of its first and last frame's time."""
        indices = list(sampling.indices)
        indices += [indices[-1]] * (-len(indices) % self.temporal)
        seconds = [index / sampling.source_fps for index in indices]
        t = self.temporal
        return [(seconds[i] + seconds[i + t - 1]) / 2 for i in range(0, len(seconds), t)]


def load_video_processor(model_dir: str | Path, takes_video: bool) -> QwenVideoProcessor | None:
    """The checkpoint's video processor, or None for a model that takes no video."""
    return QwenVideoProcessor.from_model_dir(model_dir) if takes_video else None


def text_encoder(model_dir: str | Path) -> Callable[[str], list[int]]:
    """Plain text → ids with the checkpoint's tokenizer (no special tokens): for timestamps."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    return lambda text: tokenizer.encode(text, add_special_tokens=False).ids


def video_replacement(
    video: PreprocessedVideo,
    encode: Callable[[str], Sequence[int]],
    vision_start_id: int,
    vision_end_id: int,
    video_token_id: int,
) -> list[int]:
    """The token ids one video's anchor becomes (each timestamp encoded on its own)."""
    ids: list[int] = []
    for seconds in video.timestamps:
        ids.extend(encode(f"<{seconds:.1f} seconds>"))
        ids.append(vision_start_id)
        ids.extend([video_token_id] * video.tokens_per_frame)
        ids.append(vision_end_id)
    return ids
