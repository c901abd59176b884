"""Run by the vLLM venv's Python: transformers' own ``Qwen3VLVideoProcessor`` (torch and
torchvision, which Tandem's environment does not install) on frames given as ``.npy``.

    python hf_video_processor.py MODEL_DIR FRAMES.npy META.json OUT.npz

META holds the sampled frames' indices, the stream's frame count and rate (what vLLM's
video loader hands the processor); OUT gets ``pixels`` (float32) and ``grid``.
"""

from __future__ import annotations

import json
import sys

import numpy as np
from transformers import AutoVideoProcessor
from transformers.video_utils import VideoMetadata


def main(model_dir: str, frames_path: str, meta_path: str, out_path: str) -> None:
    with open(meta_path, encoding="utf-8") as f:
        meta = json.load(f)
    processor = AutoVideoProcessor.from_pretrained(model_dir)
    metadata = VideoMetadata(
        total_num_frames=meta["total"], fps=meta["fps"], frames_indices=meta["indices"]
    )
    out = processor(
        videos=[np.load(frames_path)],
        video_metadata=[metadata],
        do_sample_frames=False,  # the frames given are the sampled ones, as vLLM gives them
        return_tensors="np",
    )
    np.savez(
        out_path,
        pixels=np.asarray(out["pixel_values_videos"], dtype=np.float32),
        grid=np.asarray(out["video_grid_thw"], dtype=np.int64),
    )


if __name__ == "__main__":
    main(*sys.argv[1:5])
