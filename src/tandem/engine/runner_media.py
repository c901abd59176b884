"""Where each image's tokens sit in a prompt, and which images a prefill must encode.

The k-th image owns the next ``tokens_per_image[k]`` image-token positions, in
prompt order; item ranges, grids and pixel rows are checked against that so a
mismatched request fails loudly instead of being answered image-blind.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tandem.engine.runner_positions import mrope_positions
from tandem.engine.types import MediaInputs
from tandem.models.info import ModelInfo


class MediaLayoutError(ValueError):
    """Prompt tokens, media items, grids and pixels do not describe the same images."""


class MissingPixelsError(ValueError):
    """Image tokens must be computed but the request carries no pixels for them."""


class VisionUnavailableError(ValueError):
    """Image tokens must be computed but this runner has no vision tower."""


@dataclass(slots=True)
class ImageSlot:
    index: int
    positions: np.ndarray  # token indices of this image's embeddings, ascending
    grid: np.ndarray | None  # (t, h, w) for M-RoPE families
    pixel_rows: slice  # rows of MediaInputs.pixel_values holding this image


@dataclass(slots=True)
class MediaPlan:
    slots: list[ImageSlot]
    mrope: np.ndarray | None  # [3, len(prompt)] M-RoPE positions; None for plain RoPE
    rope_delta: int


def plan_media(input_ids: Sequence[int], media: MediaInputs | None, info: ModelInfo) -> MediaPlan:
    ids = np.asarray(input_ids, dtype=np.int64)
    image_pos = np.flatnonzero(ids == info.image_token_id)
    items = media.items if media is not None else []
    if media is not None and media.im_token_id not in (None, info.image_token_id):
        raise MediaLayoutError(
            f"media im_token_id {media.im_token_id} is not the model's image token "
            f"{info.image_token_id}"
        )
    if media is None or not items:
        return _plan_without_items(len(ids), image_pos, info)
    grid = _grids(media, len(items), info)
    counts = _token_counts(grid, len(items), info)
    if int(counts.sum()) != len(image_pos):
        raise MediaLayoutError(
            f"the prompt has {len(image_pos)} image tokens but its {len(items)} image(s) "
            f"need {int(counts.sum())}"
        )
    slots: list[ImageSlot] = []
    token_start = 0
    row_start = 0
    for k, item in enumerate(items):
        positions = image_pos[token_start : token_start + counts[k]]
        token_start += counts[k]
        if item.length and not (
            item.offset <= positions[0] and positions[-1] < item.offset + item.length
        ):
            raise MediaLayoutError(
                f"image {k}: its tokens at {positions[0]}..{positions[-1]} fall outside the "
                f"placeholder range ({item.offset}, {item.length})"
            )
        rows = int(grid[k].prod()) if grid is not None else 1
        slots.append(
            ImageSlot(
                k, positions, None if grid is None else grid[k], slice(row_start, row_start + rows)
            )
        )
        row_start += rows
    if media.pixel_values is not None and len(media.pixel_values) != row_start:
        raise MediaLayoutError(
            f"pixel_values has {len(media.pixel_values)} rows; the images need {row_start}"
        )
    if not info.family.has_mrope:
        return MediaPlan(slots, None, 0)
    return MediaPlan(slots, *_mrope(len(ids), slots, info))


def _plan_without_items(length: int, image_pos: np.ndarray, info: ModelInfo) -> MediaPlan:
    # With no items, image tokens can only be part of KV computed elsewhere; the
    # runner rejects them in the computed region. M-RoPE cannot place them at all.
    if len(image_pos) and info.family.has_mrope:
        raise MediaLayoutError(
            f"the prompt has {len(image_pos)} image tokens but no image grids; "
            "M-RoPE positions cannot be computed without image_grid_thw"
        )
    return MediaPlan([], None, 0)


def _grids(media: MediaInputs, n: int, info: ModelInfo) -> np.ndarray | None:
    if not info.family.has_mrope:
        return None
    grid = media.grids.get("image_grid_thw")
    if grid is None:
        raise MediaLayoutError(
            f"{n} image(s) but no image_grid_thw: M-RoPE positions need the image grids"
        )
    grid = np.asarray(grid, dtype=np.int64).reshape(-1, 3)
    if len(grid) != n:
        raise MediaLayoutError(f"image_grid_thw has {len(grid)} rows for {n} image(s)")
    return grid


def _token_counts(grid: np.ndarray | None, n: int, info: ModelInfo) -> np.ndarray:
    if grid is None:
        if info.image_seq_length is None:
            raise MediaLayoutError("the model has no fixed image token count")
        return np.full(n, info.image_seq_length, dtype=np.int64)
    merge = info.spatial_merge_size or 1
    patches = grid.prod(axis=1)
    if (patches % (merge * merge)).any() or (grid <= 0).any():
        raise MediaLayoutError(f"image_grid_thw {grid.tolist()} is not a valid merged grid")
    return patches // (merge * merge)


def _mrope(length: int, slots: list[ImageSlot], info: ModelInfo) -> tuple[np.ndarray, int]:
    spans: list[tuple[int, int]] = []
    for slot in slots:
        first, count = int(slot.positions[0]), len(slot.positions)
        if int(slot.positions[-1]) != first + count - 1:
            raise MediaLayoutError(f"image {slot.index}: its tokens are not one contiguous run")
        spans.append((first, count))
    grids = np.stack([slot.grid for slot in slots if slot.grid is not None])
    return mrope_positions(length, spans, grids, info.spatial_merge_size or 1)
