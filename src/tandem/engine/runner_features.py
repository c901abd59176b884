"""Image features that come from elsewhere, and pixels that come without a prompt (E/P/D).

A prefill worker may take an image's features from an encode worker instead of running
a vision tower: they are checked against what this model's encoder would produce, since
features of another shape (another model, another grid) would otherwise be placed
silently or fail deep inside torch. An encode worker gets one image's pixels and grid
with no prompt to check them against: :func:`image_input` checks them and says how many
tokens they encode to.
"""

from __future__ import annotations

import numpy as np

from tandem.engine.runner_media import MediaLayoutError, token_counts
from tandem.engine.types import ImageFeatures
from tandem.models.info import ModelInfo


def check_features(
    features: ImageFeatures, index: int, tokens: int, hidden: int, deepstack_layers: int
) -> None:
    """Refuse features of another shape than this model's encoder makes for image ``index``."""
    what = f"precomputed features of image {index}"
    if len(features.deepstack) != deepstack_layers:
        raise MediaLayoutError(
            f"{what}: {len(features.deepstack)} DeepStack layer(s); this model's encoder "
            f"gives {deepstack_layers}"
        )
    named = [("embeds", features.embeds)]
    named += [(f"deepstack[{layer}]", t) for layer, t in enumerate(features.deepstack)]
    for name, tensor in named:
        if tuple(tensor.shape) != (tokens, hidden):
            raise MediaLayoutError(
                f"{what}: {name} has shape {list(tensor.shape)}; this model's encoder gives "
                f"[{tokens}, {hidden}] (the tokens the prompt holds for it, the hidden size)"
            )
        if not tensor.dtype.is_floating_point:
            raise MediaLayoutError(f"{what}: {name} is {tensor.dtype}, not floating point")


def image_input(
    pixels: np.ndarray, grid: np.ndarray | None, info: ModelInfo
) -> tuple[np.ndarray | None, int]:
    """One image's grid as the encoder takes it, and the tokens it encodes to.

    For an encode worker, whose pixels arrive with no prompt to check them against.
    """
    if not info.family.has_mrope:
        if grid is not None:
            raise MediaLayoutError(f"the {info.family.name} model takes no image grid")
        if pixels.ndim not in (3, 4) or (pixels.ndim == 4 and len(pixels) != 1):
            raise MediaLayoutError(
                f"one image's pixel values are [channels, height, width] (or with a batch of "
                f"1), not {list(pixels.shape)}"
            )
        return None, int(token_counts(None, 1, info)[0])
    if grid is None:
        raise MediaLayoutError("M-RoPE images need their image_grid_thw")
    thw = np.asarray(grid, dtype=np.int64).reshape(-1)
    if thw.shape != (3,):
        raise MediaLayoutError(f"one image's grid is (t, h, w), not {np.asarray(grid).tolist()}")
    tokens = int(token_counts(thw.reshape(1, 3), 1, info)[0])
    if len(pixels) != int(thw.prod()):
        raise MediaLayoutError(
            f"pixel values have {len(pixels)} rows; the grid {thw.tolist()} needs {int(thw.prod())}"
        )
    return thw, tokens
