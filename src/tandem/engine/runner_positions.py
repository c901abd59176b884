"""M-RoPE positions of a Qwen3-VL prompt, computed from token ids and image grids alone.

Because positions depend only on ids and ``image_grid_thw`` (never on pixels),
a decode worker that receives KV plus grids computes exactly the positions the
prefill worker used, and the same ``rope_delta`` for the tokens it generates.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def image_positions(grid_thw: Sequence[int], merge: int, start: int) -> np.ndarray:
    """[3, t*h*w] (temporal, height, width) positions of one image's tokens.

    Tokens follow the merger's order, row-major over (t, h, w) of the merged
    grid; every axis is offset by ``start``, the position the image begins at.
    """
    t, h, w = int(grid_thw[0]), int(grid_thw[1]) // merge, int(grid_thw[2]) // merge
    tt, hh, ww = np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij")
    return np.stack([tt.ravel(), hh.ravel(), ww.ravel()]).astype(np.int64) + start


def mrope_positions(
    length: int, image_spans: Sequence[tuple[int, int]], grids: np.ndarray, merge: int
) -> tuple[np.ndarray, int]:
    """Positions ``[3, length]`` of a prompt and its rope delta.

    ``image_spans[k] = (first, count)`` locates image k's tokens (a contiguous
    run) in prompt order; ``grids[k]`` is its ``(t, h, w)`` patch grid. Text
    advances all three axes by one per token; an image occupies ``max(h, w)``
    merged positions. The delta is what generated tokens add to their index.
    """
    positions = np.empty((3, length), dtype=np.int64)
    cursor = 0  # next token index
    next_pos = 0  # next free position value
    for (first, count), grid in zip(image_spans, grids, strict=True):
        text = first - cursor
        positions[:, cursor:first] = next_pos + np.arange(text)
        next_pos += text
        block = image_positions(grid, merge, next_pos)
        if block.shape[1] != count:
            raise ValueError(f"an image grid of {block.shape[1]} tokens covers {count} tokens")
        positions[:, first : first + count] = block
        next_pos += max(int(grid[1]), int(grid[2])) // merge
        cursor = first + count
    positions[:, cursor:] = next_pos + np.arange(length - cursor)
    delta = int(positions.max()) + 1 - length if length else 0
    return positions, delta
