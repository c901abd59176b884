"""TokenSpeed's ``mm_inputs.items`` (router-side preprocessed images) as the engine's media.

One ``MultimodalItem`` per image, in prompt order: its modality (IMAGE; UNSPECIFIED reads as
IMAGE), its own pixel rows (``encoder_input``), its own slice of the model's tensors
(``model_specific_tensors``: a ``[1, 3]`` ``image_grid_thw`` row for Qwen3-VL, nothing for
LLaVA), its placeholder range(s) and optionally the image token. The engine's
``MediaInputs`` is the items' rows joined in prompt order, their tensors stacked per key
(``image_grid_thw`` ``[n, 3]``) and one ``MediaItem`` per item.

Identity: each item's ``mm_hash`` is this worker's own digest of what it computes from,
the item's ``encoder_input`` and model tensors (``item_digest``), never the gateway's
``content_hash``: a wrong hash from a gateway must not salt the prefix cache with another
image's KV.

A decode leg's items carry the metadata only (no ``encoder_input``, and if one is sent
it is ignored): its media come from the prefill's description over the KV side channel,
and ``check_described`` holds the two to the same number of items.

``check_layout`` holds a prompt, its ranges and grids to the engine's own layout rules
without pixels, so an E/P/D prefill refuses a mislaid prompt before it waits for
embeddings its encode workers will never store (smg 1.13 sends LLaVA images too few
tokens, then answers a prefill silent for 3 s with 504 instead of the refusal).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tandem.engine.refusals import RefusedField
from tandem.engine.runner_media import plan_media
from tandem.engine.types import MediaInputs, MediaItem
from tandem.media import media_hash
from tandem.models.info import ModelInfo
from tandem.wire.dtypes import TensorCodecError
from tandem.wire.tokenspeed import (
    IMAGE,
    MODALITY_NAMES,
    MODALITY_UNSPECIFIED,
    decode_tensor,
    tensor_nbytes,
    tpb,
)

LMO_REASON = (
    "this worker runs the language model only (--language-model-only) and has no vision encoder"
)
GRID_KEY = "image_grid_thw"


@dataclass(slots=True)
class WireItem:
    """One item as read off the wire: where its tokens sit, its tensors, its pixels."""

    index: int
    offset: int
    length: int
    tensors: dict[str, np.ndarray]
    pixels: np.ndarray | None  # None: no encoder_input (or a decode leg, which ignores it)
    digest: str = ""  # set with pixels


def has_pixels(request: tpb.GenerateRequest) -> bool:
    return any(item.HasField("encoder_input") for item in request.mm_inputs.items)


def pixel_bytes(request: tpb.GenerateRequest) -> int:
    """The items' ``encoder_input`` bytes, as their shapes and dtypes state them."""
    return sum(
        tensor_nbytes(item.encoder_input)
        for item in request.mm_inputs.items
        if item.HasField("encoder_input")
    )


def item_digest(item: tpb.MultimodalItem) -> str:
    """BLAKE3 of the item's pixel bytes and model tensors, with their dtypes and shapes."""
    tensors = [("encoder_input", item.encoder_input)]
    tensors += sorted(item.model_specific_tensors.items())
    header = json.dumps([[name, t.dtype, list(t.shape)] for name, t in tensors])
    return media_hash(b"".join([header.encode(), *(t.inline for _, t in tensors)]))


def read_items(
    request: tpb.GenerateRequest, n_ids: int, model: ModelInfo, *, pixels: bool
) -> list[WireItem]:
    """Every item checked (modality, placeholders, token id, tensors); with ``pixels``
    their ``encoder_input`` decoded too (a decode leg reads none)."""
    items: list[WireItem] = []
    end = 0
    for k, item in enumerate(request.mm_inputs.items):
        _check_modality(k, item)
        offset, length = _span(k, item, n_ids)
        if offset < end:
            raise ValueError(
                f"mm_inputs.items[{k}]: its placeholders at {offset} overlap or precede "
                "the item before; items go in prompt order, one range of image tokens each"
            )
        end = offset + length
        if item.HasField("placeholder_token_id") and (
            item.placeholder_token_id != model.image_token_id
        ):
            raise ValueError(
                f"mm_inputs.items[{k}].placeholder_token_id {item.placeholder_token_id} is not "
                f"the model's image token {model.image_token_id}"
            )
        if "video_grid_thw" in item.model_specific_tensors:
            raise ValueError(f"mm_inputs.items[{k}] is an image but carries video_grid_thw")
        try:
            tensors = {key: decode_tensor(t) for key, t in item.model_specific_tensors.items()}
            sent = pixels and item.HasField("encoder_input")
            rows = decode_tensor(item.encoder_input) if sent else None
        except TensorCodecError as exc:
            raise ValueError(f"mm_inputs.items[{k}]: {exc}") from None
        wire = WireItem(k, offset, length, tensors, rows)
        if rows is not None:
            wire.pixels = _item_rows(k, rows, tensors, model)
            wire.digest = item_digest(item)
        items.append(wire)
    return items


def _check_modality(k: int, item: tpb.MultimodalItem) -> None:
    if item.modality in (IMAGE, MODALITY_UNSPECIFIED):
        return
    name = MODALITY_NAMES.get(item.modality)
    if name is None:
        raise ValueError(
            f"mm_inputs.items[{k}]: unsupported multimodal item modality {item.modality}"
        )
    raise RefusedField(
        f"mm_inputs.items[{k}]: modality {name.upper()} is not supported by this worker "
        "(images only)",
        "multimodal_not_supported",
    )


def _span(k: int, item: tpb.MultimodalItem, n_ids: int) -> tuple[int, int]:
    """The item's token range: its one placeholder range, or the span of several."""
    ranges = [(int(p.offset), int(p.length)) for p in item.placeholders]
    if not ranges:
        raise ValueError(
            f"mm_inputs.items[{k}] has no placeholders: give the range of its image tokens "
            "in the expanded input_ids"
        )
    for offset, length in ranges:
        if length < 1 or offset + length > n_ids:
            raise ValueError(
                f"mm_inputs.items[{k}]: placeholder range ({offset}, {length}) lies outside "
                f"the {n_ids} prompt ids or is empty"
            )
    first = min(offset for offset, _ in ranges)
    last = max(offset + length for offset, length in ranges)
    return first, last - first


def _item_rows(
    k: int, rows: np.ndarray, tensors: dict[str, np.ndarray], model: ModelInfo
) -> np.ndarray:
    """One image's encoder rows, checked against its grid (or one row of a batched layout)."""
    if rows.dtype.kind != "f":
        raise ValueError(
            f"mm_inputs.items[{k}].encoder_input is {rows.dtype}; send float32 or bfloat16"
        )
    if model.family.pixels_batched and rows.ndim == 3:
        rows = rows[None]  # [3, H, W]: the item's one image without its batch axis
    if rows.ndim < 2:
        raise ValueError(f"mm_inputs.items[{k}].encoder_input has shape {list(rows.shape)}")
    missing = [key for key in model.family.grid_keys if key not in tensors]
    if missing:
        raise ValueError(
            f"mm_inputs.items[{k}] carries no {missing[0]} in model_specific_tensors: "
            f"{model.family.name} images need it"
        )
    if GRID_KEY in tensors:
        grid = np.asarray(tensors[GRID_KEY]).reshape(-1)
        if grid.size != 3 or (grid < 1).any():
            raise ValueError(
                f"mm_inputs.items[{k}].{GRID_KEY} must be one (t, h, w) row, got "
                f"{np.asarray(tensors[GRID_KEY]).tolist()}"
            )
        want = int(np.prod(grid))
    else:
        want = 1 if model.family.pixels_batched else rows.shape[0]
    if rows.shape[0] != want:
        raise ValueError(
            f"mm_inputs.items[{k}].encoder_input has {rows.shape[0]} rows; its image needs {want}"
        )
    return rows


def refuse_media_tokens(ids: Sequence[int], model: ModelInfo) -> None:
    """A prompt that holds image tokens but brings no items is refused, never computed as
    text."""
    tokens = [t for t in (model.image_token_id, model.video_token_id) if t is not None]
    count = int(np.isin(np.asarray(ids), tokens).sum())
    if count:
        raise ValueError(
            f"the prompt holds {count} image token(s) (id {model.image_token_id}) but the "
            "request carries no mm_inputs.items; send one item per image"
        )


def check_layout(ids: Sequence[int], items: list[WireItem], model: ModelInfo) -> None:
    """The prompt's image tokens, the items' ranges and their grids describe the same
    images, as the engine plans them (its MediaLayoutError, a ValueError, when not)."""
    if not items:
        return
    described = MediaInputs(
        items=[MediaItem("", item.offset, item.length) for item in items],
        im_token_id=model.image_token_id,
        grids=stack_tensors(items),
    )
    plan_media(ids, described, model)


def pixel_media(items: list[WireItem], model: ModelInfo, *, supports_vision: bool) -> MediaInputs:
    """An aggregated or prefill leg's media, every item with its own pixels."""
    missing = [item.index for item in items if item.pixels is None]
    if missing:
        raise ValueError(
            f"mm_inputs.items[{missing[0]}] has no encoder_input: send each image's pixel rows "
            "(or encode_bootstrap_info, when an encode worker computes its embeddings)"
        )
    if not supports_vision:
        raise ValueError(f"{LMO_REASON}: it cannot take encoder_input pixels")
    rows = [item.pixels for item in items if item.pixels is not None]
    tail = {r.shape[1:] for r in rows}
    if len(tail) > 1:
        raise ValueError(
            f"the items' encoder_input rows differ in shape ({sorted(map(list, tail))}); "
            "send every image preprocessed the same way"
        )
    return MediaInputs(
        items=[MediaItem(item.digest, item.offset, item.length) for item in items],
        im_token_id=model.image_token_id,
        pixel_values=np.concatenate(rows, axis=0),
        grids=stack_tensors(items),
    )


def stack_tensors(items: list[WireItem]) -> dict[str, np.ndarray]:
    """Each model tensor key's per-item slices joined in prompt order (``[n, 3]`` grids)."""
    keys = set(items[0].tensors) if items else set()
    for item in items:
        if set(item.tensors) != keys:
            raise ValueError(
                f"mm_inputs.items[{item.index}] has model tensors {sorted(item.tensors)}, "
                f"item 0 has {sorted(keys)}: every image carries the same ones"
            )
    stacked = {}
    for key in sorted(keys):
        parts = [np.atleast_1d(item.tensors[key]) for item in items]
        if key == GRID_KEY:
            parts = [part.reshape(-1, 3) for part in parts]
        if len({part.shape[1:] for part in parts}) > 1:
            raise ValueError(f"the items' {key} tensors differ in shape")
        stacked[key] = np.concatenate(parts, axis=0)
    return stacked


def check_described(items: list[WireItem], described: MediaInputs | None) -> None:
    """A decode leg's items are the prefill's: as many as the held description names."""
    held = len(described.items) if described is not None else 0
    if len(items) != held:
        raise ValueError(
            f"the decode leg carries {len(items)} mm_inputs item(s) but its prefill holds "
            f"KV for {held}: send both legs the same items"
        )
