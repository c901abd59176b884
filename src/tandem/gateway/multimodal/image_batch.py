"""Router path: the protocol-neutral half of writing processed images into a leg.

Each protocol's folder writes its own messages (``backends/<name>/``); what they share is
here: the anchors expanded into each image's token run, the model's own tensors beside the
pixels (grids, per-image patch counts) checked against the family spec, and the pixels as
a :class:`~tandem.wire.pixels.PixelPayload` kept outside the message until a leg is sent.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tandem.errors import make_error
from tandem.gateway.multimodal.plan import check_anchors
from tandem.gateway.multimodal.process import ProcessedImages
from tandem.models.info import ModelInfo
from tandem.models.placeholders import PlaceholderCountError, expand_placeholders
from tandem.wire.dtypes import canonical_dtype
from tandem.wire.pixels import PixelPayload

PIXEL_KEY = "pixel_values"
PIXEL_WIRE_DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")


def expand_images(
    input_ids: Sequence[int], processed: ProcessedImages, info: ModelInfo
) -> tuple[list[int], list[tuple[int, int]]]:
    """The ids with one anchor per image expanded into its token run, and each run's
    ``(offset, length)``. Raises 400 ``multimodal_prompt_contract_mismatch`` when anchors
    and images differ."""
    check_anchors(input_ids, info, len(processed))
    try:
        return expand_placeholders(
            input_ids, info.anchor_token_id, processed.tokens_per_image, info.image_token_id
        )
    except PlaceholderCountError as exc:  # unreachable after check_anchors; kept as a guard
        raise make_error("multimodal_prompt_contract_mismatch", str(exc)) from exc


def checked_model_tensors(processed: ProcessedImages, info: ModelInfo) -> dict[str, np.ndarray]:
    """The tensors that travel beside the pixels, checked against the family's layout."""
    tensors = _model_tensors(processed, info)
    _check_layout(processed, tensors, info)
    return tensors


def take_pixel_payload(processed: ProcessedImages, wire_dtype: str) -> PixelPayload:
    """The pixels, taken out of ``processed`` (they exist once): raw uint8 with their
    normalizing table where the processor left them raw."""
    lut = processed.normalize_lut
    pixels = processed.take_pixels()
    if lut is not None:  # raw uint8: normalized per worker when a leg is sent
        return PixelPayload.raw(pixels, lut, wire_dtype)
    return PixelPayload.from_array(pixels, wire_dtype)


def wire_pixel_dtype(pixel_dtype: str) -> str:
    wire_dtype = canonical_dtype(pixel_dtype)
    if wire_dtype not in PIXEL_WIRE_DTYPES:
        raise ValueError(f"pixel wire dtype must be one of {PIXEL_WIRE_DTYPES}, got {pixel_dtype}")
    return wire_dtype


def _model_tensors(processed: ProcessedImages, info: ModelInfo) -> dict[str, np.ndarray]:
    tensors = {key: np.asarray(value) for key, value in processed.grids.items()}
    sizes_key = info.family.pixel_sizes_key
    if sizes_key is not None:
        if processed.patches_per_image is None:
            raise make_error(
                "internal_error", f"the {info.family.name} processor gave no {sizes_key}"
            )
        tensors[sizes_key] = np.asarray(processed.patches_per_image, dtype=np.int64)
    return tensors


def _check_layout(
    processed: ProcessedImages, tensors: dict[str, np.ndarray], info: ModelInfo
) -> None:
    """The processor output must match the spec's slicing, or the worker mis-slices items.

    A mismatch here is a processor/spec bug, so it is a 500 and not the client's fault.
    """
    count = len(processed)
    pixels = processed.pixel_values
    if pixels is None:
        raise RuntimeError("the pixel values of these images were already assembled")
    problems: list[str] = []
    if len(processed.hashes) != count:
        problems.append(f"{len(processed.hashes)} hashes")
    for key in info.family.batched_keys:
        array = pixels if key == PIXEL_KEY else tensors.get(key)
        if array is None or array.ndim == 0 or array.shape[0] != count:
            shape = None if array is None else array.shape
            problems.append(f"batched {key} of shape {shape}")
    sizes_key = info.family.pixel_sizes_key
    if sizes_key is not None and int(tensors[sizes_key].sum()) != pixels.shape[0]:
        problems.append(f"{sizes_key} summing to {int(tensors[sizes_key].sum())}")
    if problems:
        raise make_error(
            "internal_error",
            f"image batch of {count} items has {', '.join(problems)}; "
            f"pixel_values shape {pixels.shape}",
        )
