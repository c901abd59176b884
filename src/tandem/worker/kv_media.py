"""A held request's pixel-free media description as JSON, for the KV side channel.

A prefill worker keeps it with the prompt KV (``engine/kv_store.py``); the side channel's
``Describe`` answers it (``worker/kv_channel.py``) so that a decode leg that carries no
media (SGLang's PD legs) keys its prefix cache with the prefill's media items and places
M-RoPE positions from the grids. The format:

    {"items": [{"mm_hash": str, "offset": int, "length": int, "modality": "image"}, ...],
     "im_token_id": int | null,
     "grids": {"image_grid_thw": {"dtype": "int64", "shape": [2, 3], "data": base64}, ...}}

``dtype`` is a wire dtype name (``tandem.wire.dtypes``) and ``data`` the array's bytes in
its wire layout (C order, little-endian). No pixels are ever in it.
"""

from __future__ import annotations

import base64
import math
from typing import Any

import numpy as np

from tandem.engine.types import MediaInputs, MediaItem
from tandem.wire.dtypes import WIRE_DTYPES, bfloat16_bits_to_float32, wire_payload

MODALITIES = ("image", "video")
# A description names a few small grid tensors; more is not a description.
MAX_GRID_BYTES = 1 << 20


class MediaDescriptionError(ValueError):
    """A media description that does not decode (a peer's bug or a foreign service)."""


def media_to_json(media: MediaInputs | None) -> dict[str, Any] | None:
    """The description of ``media`` (its pixels left out); None for no media items."""
    if media is None or not media.items:
        return None
    grids = {}
    for key, value in media.grids.items():
        payload, dtype = wire_payload(np.asarray(value))
        grids[key] = {
            "dtype": dtype,
            "shape": [int(d) for d in payload.shape],
            "data": base64.b64encode(payload.tobytes()).decode("ascii"),
        }
    return {
        "items": [
            {"mm_hash": i.mm_hash, "offset": i.offset, "length": i.length, "modality": i.modality}
            for i in media.items
        ],
        "im_token_id": media.im_token_id,
        "grids": grids,
    }


def media_from_json(data: Any) -> MediaInputs | None:
    """The pixel-free ``MediaInputs`` of a description (None for ``None``)."""
    if data is None:
        return None
    if not isinstance(data, dict):
        raise MediaDescriptionError("the media description is not a JSON object")
    items = [_item(raw, k) for k, raw in enumerate(_list(data.get("items"), "items"))]
    token = data.get("im_token_id")
    if token is not None and not _is_count(token):
        raise MediaDescriptionError(f"im_token_id {token!r} is not a token id")
    raw_grids = data.get("grids") or {}
    if not isinstance(raw_grids, dict):
        raise MediaDescriptionError("grids is not a JSON object")
    grids = {str(key): _grid(value, str(key)) for key, value in raw_grids.items()}
    return MediaInputs(items=items, im_token_id=token, grids=grids) if items else None


def _list(value: Any, name: str) -> list[Any]:
    if not isinstance(value, list):
        raise MediaDescriptionError(f"{name} is not a JSON list")
    return value


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _item(raw: Any, index: int) -> MediaItem:
    if not isinstance(raw, dict):
        raise MediaDescriptionError(f"media item {index} is not a JSON object")
    mm_hash, offset, length = raw.get("mm_hash"), raw.get("offset"), raw.get("length")
    modality = raw.get("modality", "image")
    if not isinstance(mm_hash, str) or not mm_hash:
        raise MediaDescriptionError(f"media item {index} has no mm_hash")
    if not isinstance(offset, int) or not isinstance(length, int):
        raise MediaDescriptionError(f"media item {index} has a bad offset or length")
    if not _is_count(offset) or not _is_count(length):
        raise MediaDescriptionError(f"media item {index} has a bad offset or length")
    if modality not in MODALITIES:
        raise MediaDescriptionError(f"media item {index} has modality {modality!r}")
    return MediaItem(mm_hash, offset, length, modality)


def _grid(raw: Any, key: str) -> np.ndarray:
    if not isinstance(raw, dict):
        raise MediaDescriptionError(f"grid {key} is not a JSON object")
    dtype, shape, text = raw.get("dtype"), raw.get("shape"), raw.get("data")
    if dtype not in WIRE_DTYPES or not isinstance(text, str):
        raise MediaDescriptionError(f"grid {key} has dtype {dtype!r} or no data")
    dims = _list(shape, f"grid {key} shape")
    if not all(_is_count(d) for d in dims):
        raise MediaDescriptionError(f"grid {key} has shape {dims!r}")
    try:
        payload = base64.b64decode(text, validate=True)
    except ValueError:
        raise MediaDescriptionError(f"grid {key} data is not base64") from None
    want = math.prod(dims) * WIRE_DTYPES[dtype].itemsize
    if len(payload) != want or want > MAX_GRID_BYTES:
        raise MediaDescriptionError(f"grid {key}: {len(payload)} bytes for shape {dims}")
    array = np.frombuffer(payload, dtype=WIRE_DTYPES[dtype]).reshape(dims)
    return bfloat16_bits_to_float32(array) if dtype == "bfloat16" else array.copy()
