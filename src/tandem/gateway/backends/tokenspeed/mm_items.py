"""Router path: processed images written as TokenSpeed's per-item ``MultimodalItem``\\ s.

The layout TokenSpeed workers read (docs/worker-protocols.md): one item per image, in
prompt order, each with its modality, its ``content_hash`` (BLAKE3 of the image's hex
media hash, 32 bytes), its own slice of the model's tensors (``image_grid_thw`` row,
patch count), its placeholder range (the run of its image tokens in the expanded ids) and
the image token as ``placeholder_token_id``. Each item's ``encoder_input`` (its own pixel
rows) is not written here: the pixels stay outside the message until a leg is sent
(``splice.py``), so they exist once in the gateway, and a leg that must not carry them
(decode, E/P/D prefill) simply never gets them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tandem.gateway.multimodal.image_batch import (
    checked_model_tensors,
    expand_images,
    take_pixel_payload,
    wire_pixel_dtype,
)
from tandem.gateway.multimodal.process import ProcessedImages
from tandem.models.family import FAMILIES
from tandem.models.info import ModelInfo
from tandem.wire.dtypes import TensorCodecError
from tandem.wire.pixels import PixelPayload
from tandem.wire.tokenspeed import IMAGE, content_hash, encode_into, tpb

# The model tensors that say how many pixel rows an item owns (a flat pixel layout);
# without one, an item owns one row of a batched layout.
ROW_COUNT_KEYS = frozenset(f.pixel_sizes_key for f in FAMILIES.values() if f.pixel_sizes_key)


def attach_images(
    request: tpb.GenerateRequest,
    input_ids: Sequence[int],
    processed: ProcessedImages,
    info: ModelInfo,
    pixel_dtype: str = "float32",
) -> tuple[list[int], list[tuple[int, int]], PixelPayload]:
    """Expand the anchors into ``request`` and write one item per image (all but its
    pixels). Returns the expanded ids, each image's ``(offset, length)`` and the pixel
    payload. Every refusal comes before ``request`` is touched."""
    wire_dtype = wire_pixel_dtype(pixel_dtype)
    expanded, ranges = expand_images(input_ids, processed, info)
    tensors = checked_model_tensors(processed, info)
    hashes = list(processed.hashes)
    batch = request.mm_inputs
    batch.Clear()
    for index, ((offset, length), hex_hash) in enumerate(zip(ranges, hashes, strict=True)):
        item = batch.items.add(modality=IMAGE, content_hash=content_hash(hex_hash))
        item.placeholders.add(offset=offset, length=length)
        item.placeholder_token_id = info.image_token_id
        for key, array in tensors.items():
            try:
                encode_into(item.model_specific_tensors[key], _item_slice(array, index))
            except TensorCodecError as exc:
                raise ValueError(str(exc)) from None
    del request.tokenized.input_ids[:]
    request.tokenized.input_ids.extend(expanded)
    return expanded, ranges, take_pixel_payload(processed, wire_dtype)


def _item_slice(array: np.ndarray, index: int) -> np.ndarray:
    """Item ``index``'s part of a batched model tensor (its first axis, kept as an axis)."""
    return np.ascontiguousarray(array[index : index + 1])


def item_rows(item: tpb.MultimodalItem) -> int:
    """How many rows of the request's pixel batch belong to ``item``."""
    for key in ROW_COUNT_KEYS:
        if key in item.model_specific_tensors:
            tensor = item.model_specific_tensors[key]
            if tensor.dtype != "int64" or len(tensor.inline) != 8:
                raise ValueError(f"item tensor {key} does not give one row count")
            counts = np.frombuffer(tensor.inline, dtype="<i8")
            if counts[0] < 1:
                raise ValueError(f"item tensor {key} does not give one positive row count")
            return int(counts[0])
    return 1
