"""Router path, prompt half: expand the anchors and assemble vLLM's ``MultimodalInputs``.

The layout is the one vLLM workers read (docs/pd-contract.md §4): the encoder tensor as
``pixel_values``, model tensors in ``model_specific_tensors``, per-item slicing described by
``batched_keys`` / ``flat_keys`` from the family spec, and ``mm_placeholders`` as offsets into
the expanded ids.
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
from tandem.models.info import ModelInfo
from tandem.wire.pixels import PixelPayload
from tandem.wire.proto import GRID_KEYS, Modality, MultimodalInputs, TensorData
from tandem.wire.tensors import TensorCodecError, encode_into


def expand_and_assemble(
    input_ids: Sequence[int],
    processed: ProcessedImages,
    info: ModelInfo,
    *,
    pixel_dtype: str = "float32",
    out: MultimodalInputs | None = None,
    device_normalizes: bool = False,
) -> tuple[list[int], MultimodalInputs]:
    """As :func:`expand_and_assemble_detached`, with the pixels written into the batch.

    ``device_normalizes``: the batch is for a worker that wants raw uint8 pixels.
    """
    expanded, batch, detached = expand_and_assemble_detached(
        input_ids, processed, info, pixel_dtype=pixel_dtype, out=out
    )
    pixels = detached.for_worker(device_normalizes)
    target = batch.pixel_values
    target.shape.extend(pixels.shape)
    target.dtype = pixels.dtype
    target.inline = pixels.array.tobytes()  # already in its wire layout
    return expanded, batch


def expand_and_assemble_detached(
    input_ids: Sequence[int],
    processed: ProcessedImages,
    info: ModelInfo,
    *,
    pixel_dtype: str = "float32",
    out: MultimodalInputs | None = None,
) -> tuple[list[int], MultimodalInputs, PixelPayload]:
    """Expand one anchor per image into its token run and build the image batch.

    The batch is returned without ``pixel_values``; the pixels come back separately as a
    :class:`PixelPayload` in their wire layout.

    ``pixel_dtype`` is the wire dtype of ``pixel_values`` (``float32``, ``bfloat16``,
    ``float16`` or an alias). ``out`` lets the caller pass ``request.mm_inputs`` so the batch
    is written straight into the request instead of being copied there later.
    The pixel array is taken from ``processed`` (see ``ProcessedImages.take_pixels``).
    Raises 400 ``multimodal_prompt_contract_mismatch`` when anchors and images differ.
    """
    wire_dtype = wire_pixel_dtype(pixel_dtype)
    expanded, ranges = expand_images(input_ids, processed, info)
    batch = out if out is not None else MultimodalInputs()
    return expanded, batch, fill_image_batch(batch, processed, ranges, info, wire_dtype)


def fill_image_batch(
    batch: MultimodalInputs,
    processed: ProcessedImages,
    ranges: list[tuple[int, int]],
    info: ModelInfo,
    wire_dtype: str,
) -> PixelPayload:
    """Write the image batch (all but its pixels) into ``batch``; the pixels as a payload.

    ``ranges``: each image's ``(offset, length)`` in the expanded ids.
    """
    tensors = checked_model_tensors(processed, info)
    # Only now touch ``batch``: every refusal above leaves the caller's message as it was.
    batch.Clear()
    batch.modality = Modality.IMAGE
    batch.im_token_id = info.image_token_id
    for offset, length in ranges:
        batch.mm_placeholders.add(offset=offset, length=length)
    batch.mm_hashes.extend(processed.hashes)
    for key, array in tensors.items():
        write_tensor(batch.model_specific_tensors[key], array)
    family = info.family
    batch.batched_keys.extend(family.batched_keys)
    batch.flat_keys.update(family.flat_keys)
    # vLLM decode engines compute M-RoPE positions on the CPU from these grids and crash if
    # they were moved to the GPU; keep them there even if a family spec forgot to list one.
    keep_on_cpu = list(family.keep_on_cpu_keys)
    keep_on_cpu += [k for k in GRID_KEYS if k in tensors and k not in keep_on_cpu]
    batch.keep_on_cpu_keys.extend(keep_on_cpu)
    # The pixels stay outside the message (see tandem.wire.pixels): the batch is the
    # pixel-free identity, and the payload is written once, when the leg is sent.
    return take_pixel_payload(processed, wire_dtype)


def write_tensor(target: TensorData, array: np.ndarray, dtype: str | None = None) -> None:
    """Encode ``array`` inline straight into ``target`` (see ``tandem.wire.tensors``)."""
    try:
        encode_into(target, array, dtype)
    except TensorCodecError as exc:
        raise ValueError(str(exc)) from None
