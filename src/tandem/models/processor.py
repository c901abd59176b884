"""Image preprocessing with the checkpoint's own (PIL-backed) transformers processor.

Only the PIL backends are used: they need neither torch nor torchvision, so the
gateway and the worker produce the same float32 arrays from the same bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from PIL import Image

from tandem.models.family import ModelFamily
from tandem.models.info import ModelInfo, load_model_info


@dataclass(slots=True)
class PreprocessedImages:
    """Encoder inputs of a batch of images, in request order.

    ``pixel_values`` is float32: for M-RoPE families the flattened patches of all
    images stacked (``[total_patches, C*T*P*P]``, sliced per image by
    ``patches_per_image``); for grid-less families ``[n, 3, H, W]``.
    """

    pixel_values: np.ndarray
    tokens_per_image: list[int]
    grids: dict[str, np.ndarray] = field(default_factory=dict)
    patches_per_image: np.ndarray | None = None  # int64 [n]; None when batched

    def __len__(self) -> int:
        return len(self.tokens_per_image)


class ImageProcessor(Protocol):
    family: ModelFamily

    def preprocess(self, images: Sequence[Image.Image]) -> PreprocessedImages: ...


def _rgb(images: Sequence[Image.Image]) -> list[Image.Image]:
    if not images:
        raise ValueError("no images to preprocess")
    return [im if im.mode == "RGB" else im.convert("RGB") for im in images]


class QwenImageProcessor:
    """Dynamic resolution: each image becomes a grid of patches (image_grid_thw)."""

    def __init__(self, info: ModelInfo, hf_processor: Any) -> None:
        self.family = info.family
        self._hf = hf_processor
        self._merge = int(hf_processor.merge_size)

    def preprocess(self, images: Sequence[Image.Image]) -> PreprocessedImages:
        out = self._hf(images=_rgb(images), return_tensors="np")
        grid = np.asarray(out["image_grid_thw"], dtype=np.int64).reshape(-1, 3)
        patches = grid.prod(axis=1)
        return PreprocessedImages(
            pixel_values=np.ascontiguousarray(out["pixel_values"], dtype=np.float32),
            tokens_per_image=[int(p) // (self._merge * self._merge) for p in patches],
            grids={"image_grid_thw": grid},
            patches_per_image=patches.astype(np.int64),
        )


class LlavaImageProcessor:
    """Fixed resolution: every image is resized, cropped and gives the same token count."""

    def __init__(self, info: ModelInfo, hf_processor: Any) -> None:
        if info.image_seq_length is None:
            raise ValueError("a grid-less family needs a fixed image token count")
        self.family = info.family
        self._hf = hf_processor
        self._tokens = info.image_seq_length

    def preprocess(self, images: Sequence[Image.Image]) -> PreprocessedImages:
        out = self._hf(images=_rgb(images), return_tensors="np")
        pixels = np.ascontiguousarray(out["pixel_values"], dtype=np.float32)
        return PreprocessedImages(
            pixel_values=pixels, tokens_per_image=[self._tokens] * len(pixels)
        )


def load_processor(model_dir: str | Path, model_id: str | None = None) -> ImageProcessor:
    """Build the image processor of a checkpoint from its preprocessor_config.json."""
    model_dir = Path(model_dir)
    info = load_model_info(model_dir, model_id)
    # The PIL classes are named explicitly: AutoImageProcessor would pick the
    # torchvision backend where it is installed, and its resampling differs.
    if info.family.has_mrope:
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
            Qwen2VLImageProcessorPil,
        )

        return QwenImageProcessor(info, Qwen2VLImageProcessorPil.from_pretrained(model_dir))
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    return LlavaImageProcessor(info, CLIPImageProcessorPil.from_pretrained(model_dir))
