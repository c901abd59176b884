"""Placeholder expansion: one anchor token per image becomes that image's token run."""

from __future__ import annotations

from collections.abc import Sequence


class PlaceholderCountError(ValueError):
    """The prompt's anchors and the request's images do not pair up one to one."""


def count_anchors(input_ids: Sequence[int], anchor_id: int) -> int:
    return sum(1 for token in input_ids if token == anchor_id)


def expand_placeholders(
    input_ids: Sequence[int],
    anchor_id: int,
    tokens_per_image: Sequence[int],
    image_token_id: int,
) -> tuple[list[int], list[tuple[int, int]]]:
    """Replace the k-th anchor by ``tokens_per_image[k]`` copies of ``image_token_id``.

    Returns the expanded ids and one ``(offset, length)`` range per image in the
    expanded ids, in prompt order. Raises PlaceholderCountError when the number
    of anchors differs from the number of images (both extra and missing
    anchors are caller errors, never silently ignored).
    """
    anchors = count_anchors(input_ids, anchor_id)
    if anchors != len(tokens_per_image):
        raise PlaceholderCountError(
            f"the prompt has {anchors} image placeholder(s) but {len(tokens_per_image)} "
            "image(s) were given"
        )
    for k, n in enumerate(tokens_per_image):
        if n <= 0:
            raise ValueError(f"image {k} expands to {n} tokens; expected at least 1")
    expanded: list[int] = []
    ranges: list[tuple[int, int]] = []
    k = 0
    for token in input_ids:
        if token != anchor_id:
            expanded.append(token)
            continue
        n = tokens_per_image[k]
        ranges.append((len(expanded), n))
        expanded.extend([image_token_id] * n)
        k += 1
    return expanded, ranges


def expand_media(
    input_ids: Sequence[int],
    image_anchor: int,
    image_runs: Sequence[Sequence[int]],
    video_anchor: int | None,
    video_runs: Sequence[Sequence[int]],
) -> tuple[list[int], list[tuple[int, int]], list[tuple[int, int]]]:
    """Replace the k-th image anchor by ``image_runs[k]`` and the k-th video anchor by
    ``video_runs[k]``, in one pass; the ranges of each modality's items, in prompt order.

    Anchors and items must pair up one to one per modality (PlaceholderCountError).
    """
    images = count_anchors(input_ids, image_anchor)
    videos = count_anchors(input_ids, video_anchor) if video_anchor is not None else 0
    if images != len(image_runs) or videos != len(video_runs):
        raise PlaceholderCountError(
            f"the prompt has {images} image and {videos} video placeholder(s) but "
            f"{len(image_runs)} image(s) and {len(video_runs)} video(s) were given"
        )
    if any(not run for run in (*image_runs, *video_runs)):
        raise ValueError("every media item expands to at least one token")
    expanded: list[int] = []
    image_ranges: list[tuple[int, int]] = []
    video_ranges: list[tuple[int, int]] = []
    for token in input_ids:
        if token == image_anchor:
            run, ranges = image_runs[len(image_ranges)], image_ranges
        elif token == video_anchor:
            run, ranges = video_runs[len(video_ranges)], video_ranges
        else:
            expanded.append(token)
            continue
        ranges.append((len(expanded), len(run)))
        expanded.extend(run)
    return expanded, image_ranges, video_ranges
