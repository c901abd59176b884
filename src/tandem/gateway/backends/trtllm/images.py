"""Router path: processed images written into a TensorRT-LLM request.

TensorRT-LLM's engine processes images itself (``MultimodalInput.image_data``: each
image's encoded bytes), so the request carries every image's source bytes as fetched, in
prompt order, and no pixels. The gateway still processed them (the media stage keeps the
source bytes because this backend says ``keeps_image_sources``): the processor's token
count per image expands each anchor into its run of image tokens, as smg sends the ids,
and the media hashes key the cache-aware routing. The pixels the gateway computed are
dropped here, never sent.
"""

from __future__ import annotations

from collections.abc import Sequence

from tandem.errors import make_error
from tandem.gateway.multimodal.image_batch import expand_images
from tandem.gateway.multimodal.process import ProcessedImages
from tandem.models.info import ModelInfo
from tandem.wire.trtllm import trpb


def attach_images(
    request: trpb.GenerateRequest,
    input_ids: Sequence[int],
    processed: ProcessedImages,
    info: ModelInfo,
) -> tuple[list[int], list[tuple[int, int]]]:
    """Expand the anchors into ``request`` and write each image's source bytes. Returns the
    expanded ids and each image's ``(offset, length)``. Every refusal comes before
    ``request`` is touched."""
    sources = processed.sources
    if sources is None or len(sources) != len(processed):
        # The media stage keeps them for this backend; without them the engine gets no image.
        raise make_error(
            "internal_error",
            f"the trtllm legs need each image's source bytes; the media stage kept "
            f"{0 if sources is None else len(sources)} for {len(processed)} images",
        )
    expanded, ranges = expand_images(input_ids, processed, info)
    processed.pixel_values = None  # computed for the token counts; never sent
    del request.tokenized.input_token_ids[:]
    request.tokenized.input_token_ids.extend(expanded)
    media = request.multimodal_input
    del media.image_data[:]
    media.image_data.extend(sources)
    processed.sources = None  # the request holds them now
    return expanded, ranges
