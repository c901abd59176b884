"""Image encoders of the supported families: pixels of one image → its token embeddings.

Images are encoded one at a time, so an image's features never depend on which
other images share its request (what the prefix cache's media keys assume).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from tandem.engine.types import ImageFeatures

__all__ = [
    "ImageFeatures",
    "LlavaVisionEncoder",
    "QwenVisionEncoder",
    "VisionEncoder",
    "vision_encoder",
]


class VisionEncoder(Protocol):
    def encode(self, pixels: np.ndarray, grid: np.ndarray | None) -> ImageFeatures: ...


class QwenVisionEncoder:
    def __init__(self, model: nn.Module) -> None:
        hf: Any = model  # transformers resolves submodules dynamically
        self._model: Any = hf.model  # Qwen3VLModel: owns the tower and the merger

    def encode(self, pixels: np.ndarray, grid: np.ndarray | None) -> ImageFeatures:
        if grid is None:
            raise ValueError("Qwen3-VL images need their image_grid_thw")
        out = self._model.get_image_features(
            pixel_values=torch.from_numpy(np.ascontiguousarray(pixels, dtype=np.float32)),
            image_grid_thw=torch.from_numpy(np.asarray(grid, dtype=np.int64).reshape(1, 3)),
            return_dict=True,
        )
        return ImageFeatures(
            embeds=out.pooler_output[0],
            deepstack=[per_layer[0] for per_layer in out.deepstack_features],
        )


class LlavaVisionEncoder:
    def __init__(self, model: nn.Module) -> None:
        hf: Any = model  # transformers resolves submodules dynamically
        self._model: Any = hf.model  # LlavaModel: tower + projector
        self._layer = hf.config.vision_feature_layer
        self._strategy = hf.config.vision_feature_select_strategy

    def encode(self, pixels: np.ndarray, grid: np.ndarray | None) -> ImageFeatures:
        batch = np.ascontiguousarray(pixels, dtype=np.float32).reshape(1, *pixels.shape[-3:])
        out = self._model.get_image_features(
            pixel_values=torch.from_numpy(batch),
            vision_feature_layer=self._layer,
            vision_feature_select_strategy=self._strategy,
            return_dict=True,
        )
        return ImageFeatures(embeds=out.pooler_output[0])


def vision_encoder(model: nn.Module, family_name: str) -> VisionEncoder:
    if family_name == "qwen3_vl":
        return QwenVisionEncoder(model)
    if family_name == "llava":
        return LlavaVisionEncoder(model)
    raise ValueError(f"no vision encoder for family {family_name!r}")
