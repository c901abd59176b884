"""Stage: decide where the request's images and videos are processed, and do the router's part.

Router path: fetch, decode, preprocess and hash here; the worker protocol's backend then
expands the prompt and writes the pixel tensor once, straight into its request. Worker
path: the backend forwards the URLs as refs after the same URL checks the router path
would apply (and, for a worker that does not enforce Tandem's media policy, such as
vLLM's, fetches the http(s) ones here under the guard and forwards their bytes inline).

Either way the prompt's image anchors are checked first, before anything is vetted or
fetched.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from tandem.errors import make_error
from tandem.gateway import metrics
from tandem.gateway.backend import Backend
from tandem.gateway.config import GatewayConfig
from tandem.gateway.context import RequestContext
from tandem.gateway.model import ModelHandle
from tandem.gateway.multimodal.path import choose_mm_path
from tandem.gateway.multimodal.pixel_cache import PixelCache
from tandem.gateway.multimodal.plan import MediaPlan, check_anchors, check_video_anchors, plan_media
from tandem.gateway.multimodal.pool import ImagePool
from tandem.gateway.multimodal.process import process_images
from tandem.gateway.multimodal.videos import process_videos
from tandem.gateway.pipeline.prompt import check_takes_video
from tandem.gateway.workers.worker import Worker
from tandem.media import media_hash
from tandem.media.budget import ByteLease

log = logging.getLogger("tandem.gateway.media")


def checked_media_plan(
    model: ModelHandle,
    parts: Sequence[tuple[str, str]],
    prompt_ids: Sequence[int],
    workers: Sequence[Worker],
    config: GatewayConfig,
) -> MediaPlan:
    """The request's media plan after the checks that need no media traffic: the model and
    its workers take these modalities, the per-request limits, one anchor per item.

    Shared by generation (below) and ``/tokenize``, so both refuse the same requests.
    """
    videos = sum(1 for kind, _ in parts if kind == "video")
    if model.processor is None:
        raise make_error(
            "invalid_multimodal_request", f"model {model.model_id!r} does not take images"
        )
    if videos:
        check_takes_video(model)
    what = "video" if videos == len(parts) else "image and video" if videos else "image"
    if workers and all(w.language_model_only for w in workers):
        raise make_error(
            "multimodal_not_supported",
            f"{what} input is not supported by model {model.model_id!r}: its workers run as "
            "a language model only, without a vision encoder",
        )
    plan = plan_media(parts, config.mm_per_request_image_limit, config.mm_per_request_video_limit)
    # A prompt that cannot pair its media with placeholders costs no media traffic, on
    # either path (400 multimodal_prompt_contract_mismatch).
    check_anchors(prompt_ids, model.info, len(plan))
    if model.info.takes_video:
        check_video_anchors(prompt_ids, model.info, videos)
    return plan


async def prepare_media(
    ctx: RequestContext,
    config: GatewayConfig,
    workers: Sequence[Worker],
    lease: ByteLease | None = None,
    *,
    backend: Backend,
    pool: ImagePool | None = None,
    cache: PixelCache | None = None,
) -> None:
    """``workers``: every registered worker of the model (healthy or not, every role);
    ``backend``: their protocol's, which writes the outcome into ``ctx.wire``.

    ``lease``: the request's share of the in-flight image budget, charged on the router
    path before any image is decoded (gateway/multimodal/process.py). ``pool`` and
    ``cache``: the gateway's image pool (--mm-workers) and pixel cache, router path only.
    """
    if not ctx.media_urls:
        return
    model = ctx.model
    parts = list(zip(ctx.media_kinds, ctx.media_urls, strict=True))
    plan = checked_media_plan(model, parts, ctx.prompt_ids, workers, config)
    decision = choose_mm_path(
        config.mm_processing,
        forwardable=plan.forwardable,
        worker_expandable=model.info.family.worker_expandable,
        workers_accept_media_refs=[w.accepts_media_refs for w in workers],
    )
    metrics.child(metrics.MM_PROCESSING, decision.path, decision.reason).inc()
    metrics.child(metrics.MM_ITEMS, decision.path).inc(len(parts))
    ctx.mm_path = decision.path
    if decision.path == "worker":
        await backend.forward_media_refs(ctx, config, workers, plan)
        # Routing sees one anchor per item here; key each by its URL so that the
        # cache-aware policy never counts two different media as a shared prefix.
        anchor_ids = {model.info.anchor_token_id, model.info.video_token_id}
        anchors = [i for i, token in enumerate(ctx.prompt_ids) if token in anchor_ids]
        ctx.media_runs = [
            (pos, 1, "url:" + media_hash(url.encode()))
            for pos, (_, url) in zip(anchors, plan.parts, strict=True)
        ]
        return
    images = None
    if plan.image_urls:
        assert model.processor is not None  # checked_media_plan refused otherwise
        images = await process_images(
            plan,
            model.info,
            model.processor,
            config.media,
            lease=lease,
            pool=pool,
            cache=cache,
            keep_sources=backend.keeps_image_sources,
        )
        metrics.MEDIA_FETCH_SECONDS.observe(images.timings.fetch_s + images.timings.decode_s)
        metrics.MEDIA_PREPROCESS_SECONDS.observe(images.timings.preprocess_s)
    processed = None
    if plan.video_urls:
        assert model.video_processor is not None  # checked_media_plan refused otherwise
        processed = await process_videos(
            list(plan.video_urls),
            model.info,
            model.video_processor,
            config.media,
            model.encode,
            lease=lease,
        )
        metrics.MEDIA_FETCH_SECONDS.observe(processed.fetch_s + processed.decode_s)
    backend.attach_router_media(ctx, images, processed, config.wire_dtype)
    # Pixels kept beside the message travel once (a retry has none to resend); a protocol
    # whose legs carry the images themselves (TensorRT-LLM's source bytes) may retry.
    ctx.had_pixels = ctx.pixels is not None
