"""Model families: what differs between the supported vision-language architectures.

A family is fixed per architecture (Qwen3-VL, LLaVA-1.5); the token ids of one
checkpoint live in `tandem.models.info.ModelInfo`. Nothing here imports torch:
the gateway uses these specs to render, preprocess and expand prompts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class UnsupportedModelError(ValueError):
    """The checkpoint is not of a family Tandem knows how to serve."""


@dataclass(frozen=True, slots=True)
class ModelFamily:
    """Per-architecture facts used by the gateway, the wire codec and the engine.

    ``anchor_token`` is what the chat template emits once per image;
    ``image_token`` is what expansion repeats (the config's ``image_token_id``).
    The wire layout follows vLLM's field configs: a flat ``pixel_values`` is
    sliced per item by ``pixel_sizes_key``; a batched one has one row per item.
    """

    name: str
    model_types: tuple[str, ...]
    hf_class: str  # transformers class of the full model
    anchor_token: str
    image_token: str
    has_mrope: bool  # positions depend on the image grids (M-RoPE)
    grid_keys: tuple[str, ...]  # model tensors the decode leg needs for positions
    pixel_sizes_key: str | None  # None: pixel_values is batched (first dim per item)
    batched_keys: tuple[str, ...]
    keep_on_cpu_keys: tuple[str, ...]
    worker_expandable: bool  # may the worker expand anchors itself (media_refs path)
    # What the template emits once per video; None: the family takes no video.
    video_anchor_token: str | None = None

    @property
    def takes_video(self) -> bool:
        return self.video_anchor_token is not None

    @property
    def flat_keys(self) -> dict[str, str]:
        return {"pixel_values": self.pixel_sizes_key} if self.pixel_sizes_key else {}

    @property
    def pixels_batched(self) -> bool:
        return self.pixel_sizes_key is None


QWEN3_VL = ModelFamily(
    name="qwen3_vl",
    model_types=("qwen3_vl",),
    hf_class="Qwen3VLForConditionalGeneration",
    anchor_token="<|image_pad|>",
    image_token="<|image_pad|>",
    has_mrope=True,
    grid_keys=("image_grid_thw",),
    pixel_sizes_key="patches_per_image",
    batched_keys=("image_grid_thw", "patches_per_image"),
    keep_on_cpu_keys=("image_grid_thw",),
    worker_expandable=True,
    video_anchor_token="<|video_pad|>",
)

LLAVA = ModelFamily(
    name="llava",
    model_types=("llava",),
    hf_class="LlavaForConditionalGeneration",
    anchor_token="<image>",
    image_token="<image>",
    has_mrope=False,
    grid_keys=(),
    pixel_sizes_key=None,
    batched_keys=("pixel_values",),
    keep_on_cpu_keys=(),
    worker_expandable=False,
)

FAMILIES: dict[str, ModelFamily] = {family.name: family for family in (QWEN3_VL, LLAVA)}


def detect_family(config: Mapping[str, Any], model_id: str | None = None) -> ModelFamily:
    """Pick the family from a config.json mapping (its ``model_type``), else from the id."""
    model_type = str(config.get("model_type", ""))
    for family in FAMILIES.values():
        if model_type in family.model_types:
            return family
    # Some community LLaVA-1.5 conversions carry a bare or odd model_type.
    if model_id is not None and "llava-1.5" in model_id.lower():
        return LLAVA
    raise UnsupportedModelError(
        f"unsupported model_type {model_type!r}"
        + (f" for model {model_id!r}" if model_id else "")
        + f"; supported: {sorted(t for f in FAMILIES.values() for t in f.model_types)}"
    )
