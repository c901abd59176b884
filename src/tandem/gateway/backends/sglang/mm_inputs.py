"""Router path: processed images written into SGLang's ``MultimodalInputs``.

The layout SGLang workers read (docs/worker-protocols.md): the whole preprocessed batch
as ``pixel_values``, the model's own tensors (grids, per-image patch counts) in
``model_specific_tensors``, the image token in ``im_token_id`` and one
``mm_placeholders`` range per image — the run of its image tokens in the expanded ids —
in prompt order. The raw fetched bytes (``image_data``) are not sent: no SGLang worker
reads them, and they would be the image a second time on the wire. The pixels stay
outside the message until a leg is sent (``splice.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

from tandem.gateway.multimodal.image_batch import (
    checked_model_tensors,
    expand_images,
    take_pixel_payload,
    wire_pixel_dtype,
)
from tandem.gateway.multimodal.process import ProcessedImages
from tandem.models.info import ModelInfo
from tandem.wire.dtypes import TensorCodecError
from tandem.wire.pixels import PixelPayload
from tandem.wire.sglang import encode_into, spb


def attach_images(
    request: spb.GenerateRequest,
    input_ids: Sequence[int],
    processed: ProcessedImages,
    info: ModelInfo,
    pixel_dtype: str = "float32",
) -> tuple[list[int], list[tuple[int, int]], PixelPayload]:
    """Expand the anchors into ``request`` and write its image batch (all but the pixels).

    Returns the expanded ids, each image's ``(offset, length)`` and the pixel payload.
    Every refusal comes before ``request`` is touched.
    """
    wire_dtype = wire_pixel_dtype(pixel_dtype)
    expanded, ranges = expand_images(input_ids, processed, info)
    tensors = checked_model_tensors(processed, info)
    batch = request.mm_inputs
    batch.Clear()
    batch.modalities.append("image")
    batch.im_token_id = info.image_token_id
    for offset, length in ranges:
        batch.mm_placeholders.add(offset=offset, length=length)
    for key, array in tensors.items():
        try:
            encode_into(batch.model_specific_tensors[key], array)
        except TensorCodecError as exc:
            raise ValueError(str(exc)) from None
    del request.tokenized.input_ids[:]
    request.tokenized.input_ids.extend(expanded)
    return expanded, ranges, take_pixel_payload(processed, wire_dtype)
