"""SGLang's ``mm_inputs`` (router-side preprocessed images) as the engine's ``MediaInputs``.

The batch's ``pixel_values`` with the model's tensors (``model_specific_tensors``, e.g.
``image_grid_thw``), the image token and one ``mm_placeholders`` range per image, in
prompt order. As SGLang's servicer does, the batch is read only when it carries
``pixel_values``; a pixel-less one is ignored, and then a prompt that holds image tokens
is refused rather than computed as text. This worker takes preprocessed pixels only:
URLs, and raw media without pixels, are refused (``image_data`` beside ``pixel_values``
is ignored, as SGLang's servicer ignores it).

The protocol carries no media hashes: each image's identity is the hash of its own rows
of ``pixel_values`` (the batch's hash and its index when the layout does not say which
rows are whose). A decode leg gets no ``mm_inputs`` at all: it reads the prefill's media
description over the KV side channel (``worker/handoff.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tandem.engine.types import MediaInputs, MediaItem
from tandem.media import media_hash
from tandem.models.info import ModelInfo
from tandem.wire.dtypes import TensorCodecError
from tandem.wire.sglang import decode_tensor, spb

LMO_REASON = (
    "this worker runs the language model only (--language-model-only) and has no vision encoder"
)
_UNREAD = ("image_urls", "video_urls", "audio_urls", "video_data", "audio_data")


def has_pixels(request: spb.GenerateRequest) -> bool:
    return request.HasField("mm_inputs") and request.mm_inputs.HasField("pixel_values")


def refuse_unread_media(request: spb.GenerateRequest) -> None:
    """Media this worker would have to fetch or decode itself."""
    if not request.HasField("mm_inputs"):
        return
    batch = request.mm_inputs
    sent = [name for name in _UNREAD if getattr(batch, name)]
    if batch.image_data and not batch.HasField("pixel_values"):
        sent.append("image_data")
    if sent:
        raise ValueError(
            f"mm_inputs.{sent[0]} is not supported: this worker takes router-side "
            "preprocessed images only (mm_inputs.pixel_values)"
        )


def wire_media(
    request: spb.GenerateRequest, ids: Sequence[int], model: ModelInfo, *, supports_vision: bool
) -> MediaInputs | None:
    """An aggregated or prefill leg's media (None: a text prompt)."""
    if not has_pixels(request):
        _refuse_media_tokens(ids, model)
        return None
    if not supports_vision:
        raise ValueError(f"{LMO_REASON}: it cannot take pixel_values")
    batch = request.mm_inputs
    odd = [m for m in batch.modalities if m != "image"]
    if odd:
        raise ValueError(f"mm_inputs modality {odd[0]!r} is not supported (images only)")
    try:
        pixels = decode_tensor(batch.pixel_values)
        grids = {key: decode_tensor(t) for key, t in batch.model_specific_tensors.items()}
    except TensorCodecError as exc:
        raise ValueError(f"mm_inputs: {exc}") from None
    ranges = _placeholders(batch, len(ids))
    token = batch.im_token_id if batch.HasField("im_token_id") else model.image_token_id
    if token != model.image_token_id:
        raise ValueError(
            f"mm_inputs.im_token_id {token} is not the model's image token {model.image_token_id}"
        )
    hashes = item_hashes(pixels, grids, len(ranges))
    items = [MediaItem(h, off, n) for h, (off, n) in zip(hashes, ranges, strict=True)]
    return MediaInputs(items=items, im_token_id=token, pixel_values=pixels, grids=grids)


def _placeholders(batch: spb.MultimodalInputs, n_ids: int) -> list[tuple[int, int]]:
    ranges = sorted((int(p.offset), int(p.length)) for p in batch.mm_placeholders)
    if not ranges:
        raise ValueError(
            "mm_inputs carries pixel_values but no mm_placeholders: give one range per image "
            "(the run of its image tokens in the expanded input_ids)"
        )
    end = 0
    for offset, length in ranges:
        if length < 1 or offset + length > n_ids:
            raise ValueError(
                f"placeholder range ({offset}, {length}) lies outside the {n_ids} prompt ids"
            )
        if offset < end:
            raise ValueError(f"placeholder range ({offset}, {length}) overlaps the one before")
        end = offset + length
    return ranges


def _refuse_media_tokens(ids: Sequence[int], model: ModelInfo) -> None:
    tokens = [t for t in (model.image_token_id, model.video_token_id) if t is not None]
    count = int(np.isin(np.asarray(ids), tokens).sum())
    if count:
        raise ValueError(
            f"the prompt holds {count} image token(s) (id {model.image_token_id}) but the "
            "request carries no mm_inputs.pixel_values; send the preprocessed images with "
            "an aggregated or prefill leg"
        )


def item_hashes(pixels: np.ndarray, grids: dict[str, np.ndarray], n: int) -> list[str]:
    """One identity per image: the hash of its own pixel rows where the layout tells them
    (per-image patch counts, the grids, or one row per image), else of the batch."""
    rows = _rows_per_item(pixels, grids, n)
    if rows is None:
        whole = media_hash(np.ascontiguousarray(pixels).tobytes())
        return [f"{whole}-{k}" for k in range(n)]
    hashes, start = [], 0
    for count in rows:
        hashes.append(media_hash(np.ascontiguousarray(pixels[start : start + count]).tobytes()))
        start += count
    return hashes


def _rows_per_item(pixels: np.ndarray, grids: dict[str, np.ndarray], n: int) -> list[int] | None:
    if pixels.ndim == 0:
        return None
    rows: list[int] | None = None
    if "patches_per_image" in grids:
        rows = [int(v) for v in np.asarray(grids["patches_per_image"]).reshape(-1)]
    elif "image_grid_thw" in grids:
        grid = np.asarray(grids["image_grid_thw"])
        if grid.ndim == 2 and grid.shape[1] == 3:
            rows = [int(v) for v in grid.prod(axis=1)]
    elif pixels.shape[0] == n:
        rows = [1] * n
    if rows is None or len(rows) != n or sum(rows) != pixels.shape[0] or min(rows) < 1:
        return None
    return rows
