"""Router path into SGLang's ``MultimodalInputs``, with the built-in models' real processors:
the same pixels and model tensors as the vLLM layout, patch-run placeholders, the image
token, and nothing sent twice (no raw image bytes beside the pixels)."""

from __future__ import annotations

import numpy as np
from mm_gateway_models import Model
from mm_gateway_origin import ImageOrigin, png_bytes

from tandem.gateway.backends.sglang.mm_inputs import attach_images
from tandem.gateway.backends.sglang.splice import serialize_with_pixels
from tandem.gateway.backends.vllm.mm_inputs import expand_and_assemble
from tandem.gateway.multimodal import plan_images, process_images
from tandem.media import MediaPolicy
from tandem.wire.sglang import decode_tensor, spb
from tandem.wire.tensors import decode_tensor as decode_vllm_tensor

SMALL, LARGE = png_bytes((40, 30), seed=1), png_bytes((96, 64), seed=2)


async def test_sglang_batch_carries_what_the_vllm_batch_carries(
    model: Model, origin: ImageOrigin, open_policy: MediaPolicy
) -> None:
    urls = [origin.serve("/a.png", SMALL), origin.serve("/b.png", LARGE)]
    ids = model.prompt_ids(urls)
    plan = plan_images(urls)
    for_vllm = await process_images(plan, model.info, model.processor, open_policy)
    for_sglang = await process_images(plan, model.info, model.processor, open_policy)
    expanded_vllm, vllm_batch = expand_and_assemble(ids, for_vllm, model.info)

    request = spb.GenerateRequest(request_id="r")
    request.tokenized.input_ids.extend(ids)
    expanded, ranges, pixels = attach_images(request, ids, for_sglang, model.info)
    assert expanded == expanded_vllm == list(request.tokenized.input_ids)
    batch = request.mm_inputs
    assert list(batch.modalities) == ["image"]
    assert batch.im_token_id == model.info.image_token_id
    assert [(p.offset, p.length) for p in batch.mm_placeholders] == ranges
    assert ranges == [(p.offset, p.length) for p in vllm_batch.mm_placeholders]
    for offset, length in ranges:  # each range is the image's run of image tokens
        assert set(expanded[offset : offset + length]) == {model.info.image_token_id}
    assert not batch.image_data and not batch.image_urls
    assert not batch.HasField("pixel_values")  # kept beside the message until it is sent
    assert set(batch.model_specific_tensors) == set(vllm_batch.model_specific_tensors)
    for key, tensor in batch.model_specific_tensors.items():
        theirs = vllm_batch.model_specific_tensors[key]
        assert tensor.dtype == theirs.dtype
        assert np.array_equal(decode_tensor(tensor), decode_vllm_tensor(theirs))

    sent = spb.GenerateRequest.FromString(serialize_with_pixels(request, pixels.for_worker(False)))
    assert sent.mm_inputs.pixel_values.dtype == "float32"
    assert np.array_equal(
        decode_tensor(sent.mm_inputs.pixel_values), decode_vllm_tensor(vllm_batch.pixel_values)
    )
