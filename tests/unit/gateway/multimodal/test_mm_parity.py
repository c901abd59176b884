"""Parity: the worker decodes from the gateway-assembled batch exactly what it computes itself
from the same URLs on the media_refs path (same preprocessing, same tensors).

This file exercises the worker side, so it imports torch-backed worker modules.
"""

from __future__ import annotations

import numpy as np
import pytest
from mm_gateway_models import Model
from mm_gateway_origin import ImageOrigin, data_url, png_bytes

from tandem.gateway.backends.vllm.media_refs import build_media_refs
from tandem.gateway.backends.vllm.mm_inputs import expand_and_assemble
from tandem.gateway.multimodal import plan_images, process_images
from tandem.media import MediaPolicy
from tandem.wire.proto import GenerateRequest

pytest.importorskip("torch")

from tandem.worker.vllm.inputs import wire_media
from tandem.worker.vllm.media_refs import MediaRefsProcessor

FIRST, SECOND = png_bytes((50, 34), seed=5), png_bytes((80, 112), seed=6)


@pytest.mark.parametrize("source", ["http", "data"])
async def test_router_and_worker_paths_give_identical_inputs(
    model: Model, origin: ImageOrigin, open_policy: MediaPolicy, source: str
) -> None:
    if source == "http":
        urls = [origin.serve("/first.png", FIRST), origin.serve("/second.png", SECOND)]
    else:
        urls = [data_url(FIRST), data_url(SECOND)]
    ids = model.prompt_ids(urls)
    plan = plan_images(urls)

    # Router path: gateway processes and assembles; the worker decodes the wire batch.
    processed = await process_images(plan, model.info, model.processor, open_policy)
    request = GenerateRequest(request_id="parity")
    expanded, _ = expand_and_assemble(ids, processed, model.info, out=request.mm_inputs)
    request.tokenized.input_ids.extend(expanded)
    routed = wire_media(request, expanded, has_kv=False, supports_vision=True).media
    assert routed is not None

    # Worker path: the gateway forwards refs; the worker fetches and processes them itself.
    refs = await build_media_refs(plan, ids, model.info, open_policy)
    worker = await MediaRefsProcessor(model.info, model.processor, open_policy).process(refs, ids)
    local = worker.media

    assert expanded == worker.prompt_ids
    assert [(i.mm_hash, i.offset, i.length) for i in routed.items] == [
        (i.mm_hash, i.offset, i.length) for i in local.items
    ]
    assert routed.im_token_id == local.im_token_id == model.info.image_token_id
    assert routed.pixel_values is not None and local.pixel_values is not None
    assert routed.pixel_values.dtype == local.pixel_values.dtype == np.float32
    assert routed.pixel_values.shape == local.pixel_values.shape
    assert routed.pixel_values.tobytes() == local.pixel_values.tobytes()  # bit-identical
    assert set(local.grids) <= set(routed.grids)
    for key, grid in local.grids.items():
        wire_grid = routed.grids[key]
        assert wire_grid.dtype == np.asarray(grid).dtype and np.array_equal(wire_grid, grid), key
    # The wire batch may carry the flat layout's sizes tensor on top; nothing else.
    assert set(routed.grids) - set(local.grids) <= {"patches_per_image"}
    if source == "http":
        assert sorted(origin.state.paths()) == sorted(["/first.png", "/second.png"] * 2)
