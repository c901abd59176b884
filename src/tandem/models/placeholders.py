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
