"""Video in the runner: per-temporal-patch encoding and M-RoPE equal transformers' own
Qwen3-VL forward with ``pixel_values_videos``; a pixel-free decode-side plan (grids only)
gives the same positions; images and videos mix in prompt order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from tokenizers import Tokenizer

from tandem.engine.builtin_clips import shifted
from tandem.engine.builtin_shapes import draw
from tandem.engine.runner import ModelRunner
from tandem.engine.runner_media import MediaLayoutError, MissingPixelsError, plan_media
from tandem.engine.types import MediaInputs, MediaItem
from tandem.models.chat import render_chat
from tandem.models.info import load_model_info
from tandem.models.placeholders import expand_media
from tandem.models.processor import load_processor
from tandem.models.video import QwenVideoProcessor, video_replacement

NAME = "tiny-qwen3-vl"


def _frames(colour: str, shape: str, count: int) -> np.ndarray:
    base = draw(colour, shape, (128, 96)).image
    return np.stack([np.asarray(shifted(base, 2 * k)) for k in range(count)])


def _prompt(
    model_dir: Path, kinds: list[str], clips: list[np.ndarray], pictures: list[Image.Image]
):
    info = load_model_info(model_dir)
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False).ids  # noqa: E731
    parts: list[dict[str, object]] = [{"type": kind} for kind in kinds]
    parts.append({"type": "text", "text": "What is in this video?"})
    ids = encode(render_chat(model_dir, [{"role": "user", "content": parts}]))
    video = QwenVideoProcessor.from_model_dir(model_dir)
    runs, pre_videos = [], []
    for frames in clips:
        sampling = video.sample_frames(len(frames), 4.0)
        pre = video.preprocess(frames[sampling.indices], sampling, raw=False)
        pre_videos.append(pre)
        runs.append(
            video_replacement(
                pre, encode, info.vision_start_id, info.vision_end_id, info.video_token_id
            )
        )
    images = load_processor(model_dir).preprocess(pictures) if pictures else None
    image_runs = [[info.image_token_id] * n for n in images.tokens_per_image] if images else []
    ids, image_ranges, video_ranges = expand_media(
        ids, info.anchor_token_id, image_runs, info.video_token_id, runs
    )
    items = [MediaItem(f"img{k}", o, n) for k, (o, n) in enumerate(image_ranges)]
    items += [MediaItem(f"vid{k}", o, n, "video") for k, (o, n) in enumerate(video_ranges)]
    grids: dict[str, np.ndarray] = {}
    if images:
        grids.update(images.grids)
    if pre_videos:
        grids["video_grid_thw"] = np.concatenate([p.grid for p in pre_videos])
    media = MediaInputs(
        items=sorted(items, key=lambda item: item.offset),
        im_token_id=info.image_token_id if images else None,
        pixel_values=images.pixel_values if images else None,
        grids=grids,
        video_pixel_values=np.concatenate([p.pixel_values for p in pre_videos])
        if pre_videos
        else None,
    )
    return ids, media


def _hf_logits(runner: ModelRunner, ids: list[int], media: MediaInputs) -> torch.Tensor:
    tensor = torch.tensor([ids])
    info = runner.info
    types = (tensor == info.image_token_id).int() + 2 * (tensor == info.video_token_id).int()
    kwargs: dict[str, Any] = {"input_ids": tensor, "attention_mask": torch.ones_like(tensor)}
    kwargs["mm_token_type_ids"] = types
    if media.video_pixel_values is not None:
        kwargs["pixel_values_videos"] = torch.from_numpy(media.video_pixel_values)
        kwargs["video_grid_thw"] = torch.from_numpy(media.grids["video_grid_thw"])
    if media.pixel_values is not None:
        kwargs["pixel_values"] = torch.from_numpy(media.pixel_values)
        kwargs["image_grid_thw"] = torch.from_numpy(media.grids["image_grid_thw"])
    with torch.inference_mode():
        return runner.model(**kwargs).logits[0, -1]


@pytest.mark.parametrize(
    "kinds",
    [["video"], ["video", "video"], ["image", "video"], ["video", "image"]],
)
def test_video_prefill_matches_hf_forward(
    kinds: list[str], runners: dict[str, ModelRunner], builtin_dirs: dict[str, Path]
) -> None:
    runner = runners[NAME]
    clips = [_frames("red", "circle", 8), _frames("blue", "square", 6)][: kinds.count("video")]
    pictures = [draw("yellow", "triangle", (128, 96)).image] * kinds.count("image")
    ids, media = _prompt(builtin_dirs[NAME], kinds, clips, pictures)
    logits, state = runner.prefill(ids, media)
    torch.testing.assert_close(logits, _hf_logits(runner, ids, media), atol=1e-4, rtol=0)
    # The decode leg's view (grids, no pixels) places every token at the same position.
    decode_side = MediaInputs(
        items=list(media.items), im_token_id=media.im_token_id, grids=dict(media.grids)
    )
    assert plan_media(ids, decode_side, runner.info).rope_delta == state.rope_delta


def test_different_clips_same_size_give_different_logits(
    runners: dict[str, ModelRunner], builtin_dirs: dict[str, Path]
) -> None:
    runner = runners[NAME]
    red = _prompt(builtin_dirs[NAME], ["video"], [_frames("red", "circle", 8)], [])
    blue = _prompt(builtin_dirs[NAME], ["video"], [_frames("blue", "circle", 8)], [])
    assert red[0] == blue[0]  # same tokens: only the pixels differ
    a, _ = runner.prefill(*red)
    b, _ = runner.prefill(*blue)
    assert not torch.allclose(a, b, atol=1e-3)


def test_video_layout_errors(
    runners: dict[str, ModelRunner], builtin_dirs: dict[str, Path]
) -> None:
    runner = runners[NAME]
    ids, media = _prompt(builtin_dirs[NAME], ["video"], [_frames("red", "circle", 8)], [])
    no_pixels = MediaInputs(items=list(media.items), grids=dict(media.grids))
    with pytest.raises(MissingPixelsError, match="video tokens"):
        runner.prefill(ids, no_pixels)
    wrong = MediaInputs(
        items=list(media.items),
        grids={"video_grid_thw": np.array([[1, 6, 8]])},
        video_pixel_values=media.video_pixel_values,
    )
    with pytest.raises(MediaLayoutError, match="video tokens"):
        runner.prefill(ids, wrong)
    with pytest.raises(MediaLayoutError, match="no grids"):
        runner.prefill(ids, None)
