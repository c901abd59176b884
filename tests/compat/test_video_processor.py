"""Tandem's video preprocessing against transformers' own, run in the vLLM lane's venv.

transformers' ``Qwen3VLVideoProcessor`` needs torchvision, which only the vLLM venv has; the
same decoded frames go through both. Without a resize the patches must be the same bits;
with one, Pillow's bicubic and torchvision's antialiased bicubic may differ by a level or
two in a few values (docs/pd-contract.md §4, "Video"); the figure goes to build/compat.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tandem.engine.builtin import resolve_model
from tandem.engine.builtin_clips import moving_box_clip, shape_clip
from tandem.media import MediaPolicy
from tandem.media.video import decode_frames
from tandem.models.video import QwenVideoProcessor
from tandem.models.video_batch import plan_video

from .vllm_env import VENV, ensure_vllm_venv

pytestmark = [pytest.mark.compat, pytest.mark.timeout(600)]

SCRIPT = Path(__file__).with_name("hf_video_processor.py")
CLIPS = {
    "128x96, no resize": (shape_clip("red", "circle"), 0),
    "200x150, resized up": (shape_clip("blue", "square", size=(200, 150)), 1),
    "1280x720, resized down": (moving_box_clip(2, (1280, 720)), 2),
}


@pytest.mark.parametrize("name", list(CLIPS))
def test_patches_match_transformers_video_processor(name: str, tmp_path: Path) -> None:
    ensure_vllm_venv()
    model_dir = resolve_model("tiny-qwen3-vl", weights=False)
    processor = QwenVideoProcessor.from_model_dir(model_dir)
    clip, most_levels = CLIPS[name]
    plan = plan_video(clip, MediaPolicy(), processor)
    frames = decode_frames(clip, plan.sampling.indices, plan.header)
    np.save(tmp_path / "frames.npy", frames)
    meta = {"total": plan.header.frames, "fps": plan.header.fps, "indices": plan.sampling.indices}
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    subprocess.run(
        [
            str(VENV / "bin" / "python"),
            str(SCRIPT),
            str(model_dir),
            *(str(tmp_path / f) for f in ("frames.npy", "meta.json", "out.npz")),
        ],
        check=True,
        timeout=300,
    )
    theirs = np.load(tmp_path / "out.npz")
    ours = processor.preprocess(frames, plan.sampling, raw=False)
    assert theirs["grid"].tolist() == ours.grid.tolist()
    assert theirs["pixels"].shape == ours.pixel_values.shape
    # Normalized values are (x - 127.5) / 127.5: one level is 1/127.5.
    levels = np.abs(theirs["pixels"] - ours.pixel_values) * 127.5
    figure = {
        "clip": name,
        "max_levels": float(levels.max()),
        "differing": float((levels > 0).mean()),
    }
    out = Path("build/compat")
    out.mkdir(parents=True, exist_ok=True)
    slug = name.split(",")[0]
    (out / f"video-patches-{slug}.json").write_text(json.dumps(figure))
    print(f"\nvideo patches vs transformers: {figure}")
    if most_levels == 0:
        np.testing.assert_array_equal(ours.pixel_values, theirs["pixels"])
    else:
        assert levels.max() <= most_levels + 1e-3, figure
