"""Image preprocessing that matches the checkpoint's own (PIL-backed) transformers processor.

Only the PIL backends are used: they need neither torch nor torchvision, so the
gateway and the worker produce the same float32 arrays from the same bytes. By default
the work is done by :mod:`tandem.models.fast_preprocess`, which gives the same bits as
the HF processor at a fraction of its CPU; the HF processor stays for configurations
the fast path does not reproduce (and as the reference in tests, ``fast=False``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from PIL import Image

from tandem.models.family import ModelFamily
from tandem.models.fast_preprocess import ClipFastPath, QwenFastPath, value_lut
from tandem.models.info import ModelInfo, load_model_info

_CHANNELS = 3  # the processors make RGB pixel values


@dataclass(slots=True)
class PreprocessedImages:
    """Encoder inputs of a batch of images, in request order.

    ``pixel_values`` is float32: for M-RoPE families the flattened patches of all
    images stacked (``[total_patches, C*T*P*P]``, sliced per image by
    ``patches_per_image``); for grid-less families ``[n, 3, H, W]``. In both layouts the
    channel is the outermost axis after the first (``tandem.wire.pixels.normalize_raw``
    relies on it).

    With ``preprocess(..., raw=True)`` the values are the resized uint8 pixels, not yet
    rescaled or normalized, and ``normalize_lut`` (float32 ``[3, 256]``) maps each value
    of each channel to what the processor would have produced.
    """

    pixel_values: np.ndarray
    tokens_per_image: list[int]
    grids: dict[str, np.ndarray] = field(default_factory=dict)
    patches_per_image: np.ndarray | None = None  # int64 [n]; None when batched
    normalize_lut: np.ndarray | None = None  # set when pixel_values are raw uint8

    def __len__(self) -> int:
        return len(self.tokens_per_image)


class ImageProcessor(Protocol):
    family: ModelFamily

    def preprocess(
        self, images: Sequence[Image.Image], raw: bool = False
    ) -> PreprocessedImages: ...

    def resize_target(self, width: int, height: int) -> tuple[int, int] | None:
        """(width, height) a ``width x height`` image is resized to; None if unknown.

        A decoder may use it to decode fewer pixels (JPEG draft mode, media policy).
        """
        ...

    def output_nbytes(self, width: int, height: int, raw: bool = False) -> int | None:
        """Bytes of ``pixel_values`` that ``preprocess`` makes of one such image; None if
        unknown. Memory budgets charge it before the image is decoded."""
        ...


def _hf_raw(hf: Any, images: Sequence[Image.Image]) -> dict[str, Any]:
    """The HF processor's output without rescale/normalize: resized values, as uint8."""
    out = dict(hf(images=images, return_tensors="np", do_rescale=False, do_normalize=False))
    out["pixel_values"] = np.asarray(out["pixel_values"]).astype(np.uint8)
    return out


def _raw_lut(hf: Any, raw: bool) -> np.ndarray | None:
    if not raw:
        return None
    lut = value_lut(hf)
    if lut is None:
        raise ValueError("this processor's normalization cannot be applied to raw pixels")
    return lut


def _rgb(images: Sequence[Image.Image]) -> list[Image.Image]:
    if not images:
        raise ValueError("no images to preprocess")
    return [im if im.mode == "RGB" else im.convert("RGB") for im in images]


class QwenImageProcessor:
    """Dynamic resolution: each image becomes a grid of patches (image_grid_thw)."""

    def __init__(self, info: ModelInfo, hf_processor: Any, fast: bool = True) -> None:
        self.family = info.family
        self._hf = hf_processor
        self._merge = int(hf_processor.merge_size)
        self.fast_path = QwenFastPath.from_hf(hf_processor) if fast else None

    def resize_target(self, width: int, height: int) -> tuple[int, int] | None:
        if self.fast_path is None:
            return None
        try:
            return self.fast_path.resize_target(width, height)
        except ValueError:
            return None  # preprocess will refuse the image and say why

    def output_nbytes(self, width: int, height: int, raw: bool = False) -> int | None:
        target = self.resize_target(width, height)
        if target is None or self.fast_path is None:
            return None
        # [patches, C*T*P*P] covers the resized image T times over, once per channel.
        values = _CHANNELS * self.fast_path.temporal * target[0] * target[1]
        return values * (1 if raw else 4)

    def preprocess(self, images: Sequence[Image.Image], raw: bool = False) -> PreprocessedImages:
        lut = _raw_lut(self._hf, raw)
        if self.fast_path is not None:
            pixels, grid = self.fast_path(_rgb(images), raw=raw)
        else:
            if raw:
                out = _hf_raw(self._hf, _rgb(images))
            else:
                out = self._hf(images=_rgb(images), return_tensors="np")
            pixels = np.ascontiguousarray(
                out["pixel_values"], dtype=np.uint8 if raw else np.float32
            )
            grid = np.asarray(out["image_grid_thw"], dtype=np.int64).reshape(-1, 3)
        patches = grid.prod(axis=1)
        return PreprocessedImages(
            pixel_values=pixels,
            tokens_per_image=[int(p) // (self._merge * self._merge) for p in patches],
            grids={"image_grid_thw": grid},
            patches_per_image=patches.astype(np.int64),
            normalize_lut=lut,
        )


class LlavaImageProcessor:
    """Fixed resolution: every image is resized, cropped and gives the same token count."""

    def __init__(self, info: ModelInfo, hf_processor: Any, fast: bool = True) -> None:
        if info.image_seq_length is None:
            raise ValueError("a grid-less family needs a fixed image token count")
        self.family = info.family
        self._hf = hf_processor
        self._tokens = info.image_seq_length
        self.fast_path = ClipFastPath.from_hf(hf_processor) if fast else None

    def resize_target(self, width: int, height: int) -> tuple[int, int] | None:
        return None if self.fast_path is None else self.fast_path.resize_target(width, height)

    def output_nbytes(self, width: int, height: int, raw: bool = False) -> int | None:
        fast = self.fast_path
        if fast is None:
            return None
        if fast.crop is not None:
            out_h, out_w = fast.crop
        else:
            out_w, out_h = fast.resize_target(width, height) or (width, height)
        return _CHANNELS * out_h * out_w * (1 if raw else 4)

    def preprocess(self, images: Sequence[Image.Image], raw: bool = False) -> PreprocessedImages:
        lut = _raw_lut(self._hf, raw)
        if self.fast_path is not None:
            pixels = self.fast_path(_rgb(images), raw=raw)
        elif raw:
            pixels = np.ascontiguousarray(_hf_raw(self._hf, _rgb(images))["pixel_values"])
        else:
            out = self._hf(images=_rgb(images), return_tensors="np")
            pixels = np.ascontiguousarray(out["pixel_values"], dtype=np.float32)
        return PreprocessedImages(
            pixel_values=pixels, tokens_per_image=[self._tokens] * len(pixels), normalize_lut=lut
        )


def load_processor(
    model_dir: str | Path, model_id: str | None = None, *, fast: bool = True
) -> ImageProcessor:
    """Build the image processor of a checkpoint from its preprocessor_config.json.

    ``fast=False`` runs the transformers processor itself (the reference the fast path is
    tested against); with ``fast=True`` it is used only where the fast path declines.
    """
    model_dir = Path(model_dir)
    info = load_model_info(model_dir, model_id)
    # The PIL classes are named explicitly: AutoImageProcessor would pick the
    # torchvision backend where it is installed, and its resampling differs.
    if info.family.has_mrope:
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
            Qwen2VLImageProcessorPil,
        )

        hf = Qwen2VLImageProcessorPil.from_pretrained(model_dir)
        return QwenImageProcessor(info, hf, fast=fast)
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    return LlavaImageProcessor(info, CLIPImageProcessorPil.from_pretrained(model_dir), fast=fast)
