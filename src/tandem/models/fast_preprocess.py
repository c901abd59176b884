"""Bit-exact re-implementations of the transformers PIL image processors, minus their overheads.

``Qwen2VLImageProcessorPil`` and ``CLIPImageProcessorPil`` turn each image into a uint8
array, back into a PIL image to resize it, into float64 to rescale, float32 to normalize,
and finally patchify. The arithmetic they do is per pixel value and per channel, so it is a
256-entry lookup table per channel; the only real work left is PIL's resize, which is done
here on the caller's image with the same filter and target size. Every output is the same
bits as the HF processor's (tests/unit/models/test_fast_preprocess.py checks it).

A ``from_hf`` returns ``None`` for a configuration it does not reproduce; the caller then
keeps using the HF processor rather than guess.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import ceil
from numbers import Real
from typing import Any

import numpy as np
from PIL import Image

_CHANNELS = 3  # images reach the fast path as RGB


def hf_rgb(image: Image.Image) -> Image.Image:
    """transformers' ``convert_to_rgb`` for PIL images, without copying an RGB image.

    Transparency (an alpha band or a ``transparency`` colour key, which Pillow keeps in
    ``info`` after converting L/P/RGB images) is composited onto white, as HF does.
    """
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        background = Image.new("RGBA", image.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, image.convert("RGBA")).convert("RGB")
    return image if image.mode == "RGB" else image.convert("RGB")


def value_lut(hf: Any) -> np.ndarray | None:
    """float32 ``[3, 256]``: what rescale + normalize make of each uint8 value per channel.

    Computed with the very operations HF applies per element (float64 multiply then cast
    to float32; float32 subtract and divide), so a table look-up gives identical bits.
    """
    values = np.arange(256, dtype=np.uint8)
    if hf.do_rescale:
        scaled = (values.astype(np.float64) * hf.rescale_factor).astype(np.float32)
    else:
        scaled = values.astype(np.float32)
    lut = np.tile(scaled, (_CHANNELS, 1))
    if hf.do_normalize:
        mean, std = _per_channel(hf.image_mean), _per_channel(hf.image_std)
        if mean is None or std is None:
            return None
        lut = (lut - mean[:, None]) / std[:, None]
    lut = np.ascontiguousarray(lut, dtype=np.float32)
    lut.setflags(write=False)  # shared by every request thread
    return lut


def _per_channel(value: Any) -> np.ndarray | None:
    values = list(value) if isinstance(value, (list, tuple)) else [value] * _CHANNELS
    if len(values) != _CHANNELS or not all(isinstance(v, Real) for v in values):
        return None  # HF would raise (or do something else); let it
    return np.array(values, dtype=np.float32)


def _resample(hf: Any) -> int | None:
    # PilBackend.resize: None means BILINEAR; non-PIL (torchvision) modes are remapped there.
    if hf.resample is None:
        return int(Image.Resampling.BILINEAR)
    if isinstance(hf.resample, int):
        return int(hf.resample)
    return None


def _lut_planes(rgb: np.ndarray, lut: np.ndarray | None, out: np.ndarray) -> None:
    """Write ``lut[c][rgb[..., c]]`` into the channel-first ``out[c]`` (raw values if no lut)."""
    for c in range(_CHANNELS):
        if lut is None:
            out[c] = rgb[:, :, c]
        else:
            np.take(lut[c], rgb[:, :, c], out=out[c], mode="clip")


def _out_dtype(raw: bool) -> type[np.generic]:
    return np.uint8 if raw else np.float32


@dataclass(frozen=True, slots=True, eq=False)  # eq would compare arrays
class QwenFastPath:
    """Qwen2-VL: smart_resize, rescale + normalize, flatten into merge-ordered patches."""

    min_pixels: int
    max_pixels: int
    patch: int
    merge: int
    temporal: int
    resample: int
    lut: np.ndarray

    @classmethod
    def from_hf(cls, hf: Any) -> QwenFastPath | None:
        size = hf.size
        if not (hf.do_convert_rgb and hf.do_resize and size is not None):
            return None
        # Call-time min/max_pixels would override size (deprecated path): not reproduced.
        if any(getattr(hf, key, None) is not None for key in ("min_pixels", "max_pixels")):
            return None
        sizes = (size.shortest_edge, size.longest_edge)
        params = (hf.patch_size, hf.merge_size, hf.temporal_patch_size)
        if not all(isinstance(v, int) and v > 0 for v in (*sizes, *params)):
            return None
        resample, lut = _resample(hf), value_lut(hf)
        if resample is None or lut is None:
            return None
        return cls(*sizes, *params, resample=resample, lut=lut)

    def resize_target(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) the image is resized to; ValueError for extreme aspect ratios."""
        # HF's own function (imported late: transformers is slow to import), so the target
        # size, hence the grid and token count, cannot drift from the processor's.
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

        h, w = smart_resize(
            height,
            width,
            factor=self.patch * self.merge,
            min_pixels=self.min_pixels,
            max_pixels=self.max_pixels,
        )
        return w, h

    def __call__(
        self, images: Sequence[Image.Image], raw: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """Flattened patches ``[total, C*T*P*P]`` float32 and grid_thw int64 ``[n, 3]``.

        ``raw``: the resized uint8 values in the same layout, not rescaled or normalized.
        """
        # Targets first: an unacceptable image fails before any pixel work is done.
        targets = [self.resize_target(*image.size) for image in images]
        p, m, t = self.patch, self.merge, self.temporal
        grids = np.array([[1, h // p, w // p] for w, h in targets], dtype=np.int64)
        counts = grids.prod(axis=1)
        # One allocation for the whole batch, viewed as (patches, C, T, P, P) per image.
        out = np.empty((int(counts.sum()), _CHANNELS * t * p * p), dtype=_out_dtype(raw))
        start = 0
        for image, (w, h), count in zip(images, targets, counts, strict=True):
            rgb = np.asarray(hf_rgb(image).resize((w, h), resample=self.resample))
            planes = np.empty((_CHANNELS, h, w), dtype=_out_dtype(raw))
            _lut_planes(rgb, None if raw else self.lut, planes)
            gh, gw = h // p, w // p
            # HF: (C, gh/m, m, P, gw/m, m, P) -> (gh/m, gw/m, mh, mw, C, P, P), T copies.
            blocks = planes.reshape(_CHANNELS, gh // m, m, p, gw // m, m, p)
            blocks = blocks.transpose(1, 4, 2, 5, 0, 3, 6)
            dest = out[start : start + count].reshape(gh // m, gw // m, m, m, _CHANNELS, t, p, p)
            dest[...] = blocks[:, :, :, :, :, None]
            start += count
        return out, grids


@dataclass(frozen=True, slots=True, eq=False)  # eq would compare arrays
class ClipFastPath:
    """CLIP/LLaVA: shortest-edge (or fixed) resize, center crop, rescale + normalize, CHW."""

    shortest_edge: int | None  # resize so the short side is this long...
    fixed: tuple[int, int] | None  # ...or to exactly (height, width); both None: no resize
    crop: tuple[int, int] | None  # (height, width)
    resample: int
    lut: np.ndarray

    @classmethod
    def from_hf(cls, hf: Any) -> ClipFastPath | None:
        if not hf.do_convert_rgb or getattr(hf, "do_pad", None):
            return None
        shortest, fixed = None, None
        if hf.do_resize:
            size = hf.size
            if size is None or size.longest_edge or size.max_height or size.max_width:
                return None
            if size.shortest_edge:
                shortest = int(size.shortest_edge)
            elif size.height and size.width:
                fixed = (int(size.height), int(size.width))
            else:
                return None
        crop = None
        if hf.do_center_crop:
            crop_size = hf.crop_size
            if crop_size is None or not (crop_size.height and crop_size.width):
                return None
            crop = (int(crop_size.height), int(crop_size.width))
        resample, lut = _resample(hf), value_lut(hf)
        if resample is None or lut is None:
            return None
        return cls(shortest, fixed, crop, resample, lut)

    def resize_target(self, width: int, height: int) -> tuple[int, int] | None:
        """(width, height) the image is resized to before cropping; None without a resize."""
        if self.fixed is not None:
            return self.fixed[1], self.fixed[0]
        if self.shortest_edge is None:
            return None
        # transformers.image_transforms.get_resize_output_image_size, default_to_square=False.
        size = self.shortest_edge
        short, long = (width, height) if width <= height else (height, width)
        new_long = int(size * long / short)
        return (size, new_long) if width <= height else (new_long, size)

    def __call__(self, images: Sequence[Image.Image], raw: bool = False) -> np.ndarray:
        """float32 ``[n, 3, H, W]``; ValueError if the images end up of different sizes.

        ``raw``: the resized, cropped uint8 values, not rescaled or normalized.
        """
        planes = []
        for image in images:
            image = hf_rgb(image)
            target = self.resize_target(*image.size)
            if target is not None:
                image = image.resize(target, resample=self.resample)
            rgb = np.asarray(image)
            if self.crop is not None:
                rgb = _center_crop(rgb, *self.crop)
            chw = np.empty((_CHANNELS, *rgb.shape[:2]), dtype=_out_dtype(raw))
            _lut_planes(rgb, None if raw else self.lut, chw)
            planes.append(chw)
        if len({p.shape for p in planes}) != 1:
            raise ValueError(f"images of different sizes cannot be batched: {planes[0].shape}...")
        return np.stack(planes)


def _center_crop(rgb: np.ndarray, crop_h: int, crop_w: int) -> np.ndarray:
    """transformers.image_transforms.center_crop on an HWC uint8 array (zero-pads if small)."""
    height, width = rgb.shape[:2]
    top, left = (height - crop_h) // 2, (width - crop_w) // 2
    if top >= 0 and left >= 0 and top + crop_h <= height and left + crop_w <= width:
        return rgb[top : top + crop_h, left : left + crop_w]
    # HF pads with zeros before rescaling, so padded pixels go through the LUT as value 0.
    new_h, new_w = max(crop_h, height), max(crop_w, width)
    padded = np.zeros((new_h, new_w, rgb.shape[2]), dtype=rgb.dtype)
    top_pad, left_pad = ceil((new_h - height) / 2), ceil((new_w - width) / 2)
    padded[top_pad : top_pad + height, left_pad : left_pad + width] = rgb
    top, left = top + top_pad, left + left_pad
    return padded[max(0, top) : min(new_h, top + crop_h), max(0, left) : min(new_w, left + crop_w)]
