"""Stage: decide where the request's images are processed, and do the router's part.

Router path: fetch, decode, preprocess, expand and hash here, writing the pixel
tensor once, straight into the wire request. Worker path: forward the URLs as
``media_refs`` after the same URL checks the router path would apply.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from tandem.errors import make_error
from tandem.gateway import metrics
from tandem.gateway.config import GatewayConfig
from tandem.gateway.multimodal.assemble import expand_and_assemble_detached
from tandem.gateway.multimodal.media_refs import build_media_refs
from tandem.gateway.multimodal.path import choose_mm_path
from tandem.gateway.multimodal.plan import plan_images
from tandem.gateway.multimodal.process import process_images
from tandem.gateway.pipeline.context import RequestContext
from tandem.gateway.workers.worker import Worker
from tandem.media import media_hash

log = logging.getLogger("tandem.gateway.media")


async def prepare_media(
    ctx: RequestContext, config: GatewayConfig, workers: Sequence[Worker]
) -> None:
    """``workers``: every registered worker of the model (healthy or not, every role)."""
    if not ctx.image_urls:
        return
    model = ctx.model
    if model.processor is None:
        raise make_error(
            "invalid_multimodal_request", f"model {model.model_id!r} does not take images"
        )
    if workers and all(w.language_model_only for w in workers):
        raise make_error(
            "multimodal_not_supported",
            f"image input is not supported by model {model.model_id!r}: its workers run as "
            "a language model only, without a vision encoder",
        )
    plan = plan_images(ctx.image_urls, config.mm_per_request_image_limit)
    decision = choose_mm_path(
        config.mm_processing,
        forwardable=plan.forwardable,
        worker_expandable=model.info.family.worker_expandable,
        workers_accept_media_refs=[w.accepts_media_refs for w in workers],
    )
    metrics.MM_PROCESSING.labels(decision.path, decision.reason).inc()
    metrics.MM_ITEMS.labels(decision.path).inc(len(plan))
    ctx.mm_path = decision.path
    wire = ctx.wire
    assert wire is not None
    if decision.path == "worker":
        refs = await build_media_refs(plan, ctx.prompt_ids, model.info, config.media)
        wire.media_refs.CopyFrom(refs)
        # Routing sees one anchor per image here; key each by its URL so that the
        # cache-aware policy never counts two different images as a shared prefix.
        anchor = model.info.anchor_token_id
        anchors = [i for i, token in enumerate(ctx.prompt_ids) if token == anchor]
        ctx.media_runs = [
            (pos, 1, "url:" + media_hash(url.encode()))
            for pos, url in zip(anchors, plan.image_urls, strict=True)
        ]
        return
    processed = await process_images(plan, model.info, model.processor, config.media)
    metrics.MEDIA_FETCH_SECONDS.observe(processed.timings.fetch_s + processed.timings.decode_s)
    metrics.MEDIA_PREPROCESS_SECONDS.observe(processed.timings.preprocess_s)
    expanded, batch, ctx.pixels = expand_and_assemble_detached(
        ctx.prompt_ids, processed, model.info, pixel_dtype=config.wire_dtype, out=wire.mm_inputs
    )
    ctx.had_pixels = True
    del wire.tokenized.input_ids[:]
    wire.tokenized.input_ids.extend(expanded)
    ctx.media_runs = [
        (p.offset, p.length, h) for p, h in zip(batch.mm_placeholders, batch.mm_hashes, strict=True)
    ]
