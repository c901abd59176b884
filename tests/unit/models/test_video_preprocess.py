"""Qwen3-VL video preprocessing: sampling, resize, patches, timestamps and prompt runs.

The references here are written out the slow, obvious way (one frame, one patch at a time),
from the steps ``models/video.py`` documents; the fused normalization is checked against
torch's own float32 arithmetic (the engine extra installs torch).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tandem.engine.builtin_clips import noise_clip, shape_clip
from tandem.media import MediaPolicy
from tandem.media.errors import MediaDecodeFailed, MediaTooLarge
from tandem.media.video import decode_frames, probe_video
from tandem.models.info import load_model_info
from tandem.models.video import (
    QwenVideoProcessor,
    VideoRefused,
    VideoSampling,
    fused_value_lut,
    read_video_config,
    smart_resize,
    video_replacement,
)
from tandem.models.video_batch import join_videos, plan_video


@pytest.fixture(scope="module")
def processor(qwen_meta_dir: Path) -> QwenVideoProcessor:
    return QwenVideoProcessor.from_model_dir(qwen_meta_dir)


def test_sampling_follows_the_fps_rule(processor: QwenVideoProcessor) -> None:
    # 10 s at 30 fps, 2 fps wanted: int(300 / 30 * 2) = 20 frames over 0..299.
    sampled = processor.sample_frames(300, 30.0)
    assert sampled.indices == np.linspace(0, 299, 20).round().astype(int).tolist()
    assert sampled.source_fps == 30.0
    # Short clips get at least min_frames (4), never more than they have.
    assert len(processor.sample_frames(8, 4.0).indices) == 4
    assert processor.sample_frames(3, 30.0).indices == [0, 1, 2]
    # The flags override the config: more frames per second, and a cap.
    assert len(processor.sample_frames(300, 30.0, fps=4.0).indices) == 40
    assert len(processor.sample_frames(300, 30.0, fps=4.0, max_frames=10).indices) == 10
    # max_frames of the checkpoint (64) bounds any fps.
    assert len(processor.sample_frames(3000, 30.0, fps=30.0).indices) == 64
    # An unknown source rate counts as 24 fps.
    assert processor.sample_frames(240, 0.0).source_fps == 24.0


def test_smart_resize_counts_pixels_over_frames() -> None:
    assert smart_resize(4, 96, 128, 2, 32, 2048, 524288) == (96, 128)
    # 20 frames of 720p over a 524288-pixel budget shrink to the 32-pixel grid.
    h, w = smart_resize(20, 720, 1280, 2, 32, 2048, 524288)
    assert (h % 32, w % 32) == (0, 0) and 20 * h * w <= 524288
    with pytest.raises(VideoRefused, match="at least 2 frames"):
        smart_resize(1, 96, 128, 2, 32, 2048, 524288)
    with pytest.raises(VideoRefused, match="aspect ratio"):
        smart_resize(4, 32, 32 * 201, 2, 32, 0, 10**12)


def _reference_patches(frames: np.ndarray, size: tuple[int, int], p: int, m: int) -> np.ndarray:
    """One patch row at a time: pairs of frames, merge order, (C, T, P, P) per row."""
    w, h = size
    resized = [np.asarray(Image.fromarray(f).resize((w, h), resample=3)) for f in frames]
    if len(resized) % 2:
        resized.append(resized[-1])
    rows = []
    for t in range(0, len(resized), 2):
        pair = np.stack(resized[t : t + 2])  # (T, H, W, C)
        for by in range(h // p // m):
            for bx in range(w // p // m):
                for my in range(m):
                    for mx in range(m):
                        y, x = (by * m + my) * p, (bx * m + mx) * p
                        block = pair[:, y : y + p, x : x + p, :]  # (T, P, P, C)
                        rows.append(block.transpose(3, 0, 1, 2).reshape(-1))
    return np.stack(rows)


@pytest.mark.parametrize("size,count", [((128, 96), 4), ((200, 150), 5), ((64, 64), 3)])
def test_patches_match_the_slow_reference(
    processor: QwenVideoProcessor, size: tuple[int, int], count: int
) -> None:
    rng = np.random.default_rng(count)
    frames = rng.integers(0, 256, (count, size[1], size[0], 3), dtype=np.uint8)
    sampling = VideoSampling(list(range(count)), 2.0)
    pre = processor.preprocess(frames, sampling, raw=True)
    target = processor.resize_target(count, *size)
    expected = _reference_patches(frames, target, processor.patch, processor.merge)
    np.testing.assert_array_equal(pre.pixel_values, expected)
    pairs = (count + 1) // 2
    assert pre.grid.tolist() == [[pairs, target[1] // 16, target[0] // 16]]
    assert pre.tokens == pairs * (target[1] // 16) * (target[0] // 16) // 4
    normalized = processor.preprocess(frames, sampling, raw=False).pixel_values
    assert normalized.dtype == np.float32
    np.testing.assert_array_equal(normalized, (expected.astype(np.float32) - 127.5) / 127.5)


def test_fused_lut_is_torch_float32_arithmetic() -> None:
    import torch  # the engine extra, installed by make test

    config = {
        "do_rescale": True,
        "do_normalize": True,
        "rescale_factor": 1 / 255,
        # CLIP's statistics: values whose float32 products round, unlike 0.5.
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
    }
    values = torch.arange(256, dtype=torch.uint8).float().expand(3, 256)
    mean = torch.tensor(config["image_mean"]) * (1.0 / config["rescale_factor"])
    std = torch.tensor(config["image_std"]) * (1.0 / config["rescale_factor"])
    expected = (values - mean[:, None]) / std[:, None]
    np.testing.assert_array_equal(fused_value_lut(config), expected.numpy())


def test_timestamps_average_each_pair(processor: QwenVideoProcessor) -> None:
    # Frames 0, 2, 5, 7 at 4 fps: pairs (0, 2) and (5, 7) -> 0.25 s and 1.5 s.
    assert processor.timestamps(VideoSampling([0, 2, 5, 7], 4.0)) == [0.25, 1.5]
    # An odd count repeats the last index: (0, 10), (20, 20) at 10 fps.
    assert processor.timestamps(VideoSampling([0, 10, 20], 10.0)) == [0.5, 2.0]


def test_replacement_is_timestamp_marker_run_marker(qwen_meta_dir: Path) -> None:
    info = load_model_info(qwen_meta_dir)
    processor = QwenVideoProcessor.from_model_dir(qwen_meta_dir)
    frames = np.zeros((4, 96, 128, 3), dtype=np.uint8)
    pre = processor.preprocess(frames, VideoSampling([0, 2, 5, 7], 4.0))
    encode = lambda text: [ord(c) for c in text]  # noqa: E731 - a stand-in tokenizer
    assert info.video_token_id is not None
    ids = video_replacement(
        pre, encode, info.vision_start_id or 0, info.vision_end_id or 0, info.video_token_id
    )
    run = [info.vision_start_id] + [info.video_token_id] * pre.tokens_per_frame
    run += [info.vision_end_id]
    assert ids == encode("<0.2 seconds>") + run + encode("<1.5 seconds>") + run
    batch = join_videos([pre, pre], info, encode)
    assert batch.grid.tolist() == [[2, 6, 8], [2, 6, 8]]
    assert batch.patches_per_video.tolist() == [96, 96]
    assert batch.replacements == [ids, ids]


def test_checkpoint_config_is_read(qwen_meta_dir: Path) -> None:
    config = read_video_config(qwen_meta_dir)
    assert config["max_frames"] == 64 and config["size"]["longest_edge"] == 8 * 256 * 256
    assert config["cap_pixels_per_frame"] is False


def test_clip_decodes_to_its_frames(processor: QwenVideoProcessor) -> None:
    clip = shape_clip("blue", "square", frames=8, fps=4)
    assert clip == shape_clip("blue", "square", frames=8, fps=4)  # deterministic bytes
    policy = MediaPolicy()
    plan = plan_video(clip, policy, processor)
    assert plan.header.frames == 8 and plan.header.fps == 4.0
    assert (plan.header.width, plan.header.height) == (128, 96)
    assert plan.sampling.indices == [0, 2, 5, 7]
    frames = decode_frames(clip, plan.sampling.indices, plan.header)
    assert frames.shape == (4, 96, 128, 3)
    centre = frames[:, 48, 64].astype(int)
    assert (abs(centre - (30, 60, 220)) <= 12).all()  # blue, near-lossless H.264
    assert plan.nbytes == 4 * 96 * 128 * 3 + processor.output_nbytes(4, 128, 96)


def test_refusals_before_decoding(processor: QwenVideoProcessor) -> None:
    clip = noise_clip(30, (64, 48), fps=10)
    with pytest.raises(MediaTooLarge, match=r"lasts 3\.0 s"):
        probe_video(clip, MediaPolicy(max_video_seconds=2.0))
    with pytest.raises(MediaTooLarge, match="pixels per frame"):
        probe_video(clip, MediaPolicy(max_image_pixels=64 * 47))
    with pytest.raises(MediaDecodeFailed):
        probe_video(b"not a video at all", MediaPolicy())
    with pytest.raises(MediaDecodeFailed):
        probe_video(shape_clip("red", "circle")[:200], MediaPolicy())
