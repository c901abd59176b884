"""Where each image's tokens sit in a prompt, and which images a prefill must encode.

The k-th image owns the next ``tokens_per_image[k]`` image-token positions, in
prompt order; item ranges, grids and pixel rows are checked against that so a
mismatched request fails loudly instead of being answered image-blind.

Images may come with features computed elsewhere (``MediaInputs.features``, E/P/D): only
images take them, and ``pixel_values`` may then leave out those images' rows
(``engine/runner_features.py`` checks the features themselves).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tandem.engine.runner_positions import mrope_positions
from tandem.engine.types import MediaInputs, MediaItem
from tandem.models.info import ModelInfo


class MediaLayoutError(ValueError):
    """Prompt tokens, media items, grids and pixels do not describe the same images."""


class MissingPixelsError(ValueError):
    """Image tokens must be computed but the request carries no pixels for them."""


class VisionUnavailableError(ValueError):
    """Image tokens must be computed but this runner has no vision tower."""


@dataclass(slots=True)
class ImageSlot:
    """One encoder call: an image, or one temporal patch (two frames) of a video."""

    index: int  # the item's index among the request's media
    positions: np.ndarray  # token indices of this slot's embeddings, ascending
    grid: np.ndarray | None  # (t, h, w) for M-RoPE families; t is 1 for a video's patch
    pixel_rows: slice  # rows of the modality's pixel array holding this slot
    video: bool = False  # rows are in MediaInputs.video_pixel_values


@dataclass(slots=True)
class MediaPlan:
    slots: list[ImageSlot]  # in prompt order
    mrope: np.ndarray | None  # [3, len(prompt)] M-RoPE positions; None for plain RoPE
    rope_delta: int


def plan_media(input_ids: Sequence[int], media: MediaInputs | None, info: ModelInfo) -> MediaPlan:
    ids = np.asarray(input_ids, dtype=np.int64)
    image_pos = np.flatnonzero(ids == info.image_token_id)
    video_pos = (
        np.flatnonzero(ids == info.video_token_id)
        if info.video_token_id is not None
        else np.empty(0, dtype=np.int64)
    )
    items = media.items if media is not None else []
    if media is not None:
        _check_feature_keys(media)
    if media is not None and media.im_token_id not in (None, info.image_token_id):
        raise MediaLayoutError(
            f"media im_token_id {media.im_token_id} is not the model's image token "
            f"{info.image_token_id}"
        )
    if media is None or not items:
        return _plan_without_items(len(ids), image_pos, video_pos, info)
    slots = _image_slots(media, image_pos, info)
    slots += _video_slots(media, video_pos, info)
    slots.sort(key=lambda slot: int(slot.positions[0]))
    if not info.family.has_mrope:
        return MediaPlan(slots, None, 0)
    return MediaPlan(slots, *_mrope(len(ids), slots, info))


def _image_slots(media: MediaInputs, image_pos: np.ndarray, info: ModelInfo) -> list[ImageSlot]:
    images = [(k, item) for k, item in enumerate(media.items) if item.modality == "image"]
    if not images and not len(image_pos):
        return []
    grid = _grids(media, "image_grid_thw", len(images), info)
    counts = token_counts(grid, len(images), info)
    if int(counts.sum()) != len(image_pos):
        raise MediaLayoutError(
            f"the prompt has {len(image_pos)} image tokens but its {len(images)} image(s) "
            f"need {int(counts.sum())}"
        )
    rows = [int(grid[j].prod()) if grid is not None else 1 for j in range(len(images))]
    featured = set(media.features or ())
    compact = _compact_pixels(media, [k for k, _ in images], rows, featured)
    slots: list[ImageSlot] = []
    token_start = 0
    row_start = 0
    for j, (k, item) in enumerate(images):
        positions = image_pos[token_start : token_start + counts[j]]
        token_start += counts[j]
        _check_inside(item, positions, f"image {k}")
        # Compact pixels hold no rows for an image with features: its slice is empty.
        n_rows = 0 if compact and k in featured else rows[j]
        slots.append(
            ImageSlot(
                k,
                positions,
                None if grid is None else grid[j],
                slice(row_start, row_start + n_rows),
            )
        )
        row_start += n_rows
    return slots


def _compact_pixels(
    media: MediaInputs, indices: list[int], rows: list[int], featured: set[int]
) -> bool:
    """Whether ``pixel_values`` holds only the rows of the images without features.

    Either layout is accepted: every image's rows (as a request built before its images
    were encoded elsewhere has them), or only the rest. Every image has at least one row,
    so the two counts differ whenever some image has features.
    """
    pixels = media.pixel_values
    if pixels is None:
        return False
    every = sum(rows)
    bare = sum(n for k, n in zip(indices, rows, strict=True) if k not in featured)
    if len(pixels) == every:
        return False
    if featured and len(pixels) == bare:
        return True
    need = f"{every}"
    if featured:
        need += f" (every image) or {bare} (those without features)"
    raise MediaLayoutError(f"pixel_values has {len(pixels)} rows; the images need {need}")


def _video_slots(media: MediaInputs, video_pos: np.ndarray, info: ModelInfo) -> list[ImageSlot]:
    """A video's tokens are one run per temporal patch (timestamps and markers between):
    each run is encoded and placed like an image of grid ``(1, h, w)``."""
    videos = [(k, item) for k, item in enumerate(media.items) if item.modality == "video"]
    if not videos:
        if len(video_pos):
            raise MediaLayoutError(f"the prompt has {len(video_pos)} video tokens but no videos")
        return []
    if not info.family.has_mrope or info.video_token_id is None:
        raise MediaLayoutError(f"the {info.family.name} model takes no video")
    grid = _grids(media, "video_grid_thw", len(videos), info)
    assert grid is not None  # M-RoPE families always have grids
    per_frame = token_counts(
        np.column_stack([np.ones(len(grid), np.int64), grid[:, 1:]]), len(videos), info
    )
    counts = per_frame * grid[:, 0]
    if int(counts.sum()) != len(video_pos):
        raise MediaLayoutError(
            f"the prompt has {len(video_pos)} video tokens but its {len(videos)} video(s) "
            f"need {int(counts.sum())}"
        )
    slots: list[ImageSlot] = []
    token_start = row_start = 0
    for j, (k, item) in enumerate(videos):
        _check_inside(item, video_pos[token_start : token_start + counts[j]], f"video {k}")
        frame_grid = np.array([1, grid[j, 1], grid[j, 2]], dtype=np.int64)
        rows = int(frame_grid.prod())
        for _ in range(int(grid[j, 0])):
            positions = video_pos[token_start : token_start + per_frame[j]]
            token_start += per_frame[j]
            slots.append(
                ImageSlot(k, positions, frame_grid, slice(row_start, row_start + rows), True)
            )
            row_start += rows
    pixels = media.video_pixel_values
    if pixels is not None and len(pixels) != row_start:
        raise MediaLayoutError(f"video pixel values have {len(pixels)} rows; need {row_start}")
    return slots


def _check_inside(item: MediaItem, positions: np.ndarray, what: str) -> None:
    if (
        item.length
        and len(positions)
        and not (item.offset <= positions[0] and positions[-1] < item.offset + item.length)
    ):
        raise MediaLayoutError(
            f"{what}: its tokens at {positions[0]}..{positions[-1]} fall outside the "
            f"placeholder range ({item.offset}, {item.length})"
        )


def _plan_without_items(
    length: int, image_pos: np.ndarray, video_pos: np.ndarray, info: ModelInfo
) -> MediaPlan:
    # With no items, image tokens can only be part of KV computed elsewhere; the
    # runner rejects them in the computed region. M-RoPE cannot place them at all.
    if (len(image_pos) or len(video_pos)) and info.family.has_mrope:
        raise MediaLayoutError(
            f"the prompt has {len(image_pos)} image and {len(video_pos)} video tokens but no "
            "grids; M-RoPE positions cannot be computed without image_grid_thw/video_grid_thw"
        )
    return MediaPlan([], None, 0)


def _grids(media: MediaInputs, key: str, n: int, info: ModelInfo) -> np.ndarray | None:
    if not info.family.has_mrope:
        return None
    grid = media.grids.get(key)
    if grid is None:
        raise MediaLayoutError(f"{n} item(s) but no {key}: M-RoPE positions need the grids")
    grid = np.asarray(grid, dtype=np.int64).reshape(-1, 3)
    if len(grid) != n:
        raise MediaLayoutError(f"{key} has {len(grid)} rows for {n} item(s)")
    return grid


def token_counts(grid: np.ndarray | None, n: int, info: ModelInfo) -> np.ndarray:
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
            raise MediaLayoutError(
                f"media item {slot.index}: its tokens are not one contiguous run per frame"
            )
        spans.append((first, count))
    grids = np.stack([slot.grid for slot in slots if slot.grid is not None])
    return mrope_positions(length, spans, grids, info.spatial_merge_size or 1)


def _check_feature_keys(media: MediaInputs) -> None:
    for k in media.features or {}:
        if not 0 <= k < len(media.items):
            raise MediaLayoutError(
                f"precomputed features for media item {k}, but the request has "
                f"{len(media.items)} item(s)"
            )
        if media.items[k].modality != "image":
            raise MediaLayoutError(
                f"media item {k} is a {media.items[k].modality}: precomputed features are "
                "taken for images only (a video is encoded one frame pair at a time)"
            )
