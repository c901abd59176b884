"""Value types shared by the embedded engine's parts (runner, caches, scheduler).

KV layout: a sequence's KV cache is a list with one ``(key, value)`` pair per
decoder layer; each tensor is ``float32`` of shape ``[num_kv_heads, seq_len,
head_dim]``. Every part of the engine (prefix cache, KV export/import, runner)
uses this layout, so blocks can be sliced along dim 1 without reshaping.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

KVLayers = list[tuple[torch.Tensor, torch.Tensor]]


@dataclass(slots=True)
class MediaItem:
    """One image or video in an expanded prompt: its identity and where its tokens sit."""

    mm_hash: str
    offset: int  # start of the structural placeholder range in the expanded ids
    length: int  # length of that range
    modality: str = "image"  # or "video"


@dataclass(slots=True)
class ImageFeatures:
    """What a vision tower makes of one image: the embeddings that replace its tokens.

    It lives here, beside :class:`MediaInputs`, because a request may carry features
    computed by another process (an encode worker, E/P/D): the runner, the embedding
    cache and the embedding channel all share it without importing the vision code.
    """

    embeds: torch.Tensor  # [tokens, hidden]: replaces the image tokens' input embeddings
    # Qwen3-VL DeepStack: per early decoder layer, [tokens, hidden] added after that layer.
    deepstack: list[torch.Tensor] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        """Bytes held by all its tensors (what a cache or a transfer is charged)."""
        return sum(t.numel() * t.element_size() for t in (self.embeds, *self.deepstack))


@dataclass(slots=True)
class MediaInputs:
    """Multimodal inputs of one request, already expanded into the prompt.

    ``pixel_values`` (images) and ``video_pixel_values`` are None on pixel-less legs
    (identity-only or hashes-only); ``grids`` holds model tensors such as
    ``image_grid_thw`` and ``video_grid_thw`` (``[items of that modality, 3]`` int64).
    ``items`` are the images and videos in prompt order.

    ``features`` maps an image's index in ``items`` to features computed elsewhere (an
    encode worker): the runner places them instead of running its vision tower, so that
    image needs no pixels. ``pixel_values`` then holds the rows of every image, or of the
    images without features only (in prompt order). Videos cannot take features.
    """

    items: list[MediaItem]
    im_token_id: int | None = None
    pixel_values: np.ndarray | None = None
    grids: dict[str, np.ndarray] = field(default_factory=dict)
    video_pixel_values: np.ndarray | None = None
    features: dict[int, ImageFeatures] | None = None

    def of(self, modality: str) -> list[MediaItem]:
        return [item for item in self.items if item.modality == modality]

    @property
    def hashes(self) -> list[str]:
        return [item.mm_hash for item in self.items]


@dataclass(slots=True)
class ModelShape:
    """What the caches need to know about a model's KV."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_context: int

    @property
    def kv_bytes_per_token(self) -> int:
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * 4
