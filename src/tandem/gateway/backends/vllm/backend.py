"""vLLM's protocol as a :class:`~tandem.gateway.backends.backend.Backend`."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from tandem.gateway import metrics
from tandem.gateway.backends.vllm.connector import kv_mode_for_worker
from tandem.gateway.backends.vllm.fanout import fanout_requests, fanout_width
from tandem.gateway.backends.vllm.inline_refs import (
    check_data_refs_accepted,
    gateway_must_fetch,
    has_network_refs,
    inline_network_refs,
)
from tandem.gateway.backends.vllm.media_refs import build_media_refs
from tandem.gateway.backends.vllm.mm_inputs import expand_and_assemble_detached
from tandem.gateway.backends.vllm.mm_inputs_video import expand_and_assemble_media
from tandem.gateway.backends.vllm.pd_parallel import open_parallel
from tandem.gateway.backends.vllm.pd_sequential import open_sequential
from tandem.gateway.backends.vllm.request import build_wire_request
from tandem.gateway.backends.vllm.sender import VllmSender
from tandem.gateway.backends.vllm.tensor_transport import TensorTransport
from tandem.gateway.config import GatewayConfig
from tandem.gateway.context import RequestContext
from tandem.gateway.dispatch.streams import OpenedStream
from tandem.gateway.multimodal.plan import MediaPlan
from tandem.gateway.multimodal.process import ProcessedImages
from tandem.gateway.multimodal.videos import ProcessedVideos
from tandem.gateway.pd.selection import Pair
from tandem.gateway.workers.protocol import Leg
from tandem.gateway.workers.registry import WorkerRegistry
from tandem.gateway.workers.worker import Worker
from tandem.wire.requests import has_media_refs, sampling_n

log = logging.getLogger("tandem.gateway.media")


class VllmBackend:
    """``vllm.grpc.engine.VllmEngine`` workers (vLLM's own, and Tandem's)."""

    name = "vllm"
    keeps_image_sources = False  # the legs carry pixels, processed in the gateway

    def __init__(self, transport: TensorTransport | None = None, stream_client: str = "h2") -> None:
        self.sender = VllmSender(transport, stream_client)

    @classmethod
    def from_config(cls, config: GatewayConfig) -> VllmBackend:
        transport = TensorTransport(config.mm_tensor_transport, config.mm_shm_min_bytes)
        return cls(transport, config.worker_stream_client)

    def build_request(self, ctx: RequestContext) -> None:
        build_wire_request(ctx)

    def attach_router_media(
        self,
        ctx: RequestContext,
        images: ProcessedImages | None,
        videos: ProcessedVideos | None,
        pixel_dtype: str,
    ) -> None:
        wire, info = ctx.wire, ctx.model.info
        if videos is not None:
            expanded, ctx.media_runs, ctx.pixels = expand_and_assemble_media(
                ctx.prompt_ids, images, videos, info, wire, pixel_dtype=pixel_dtype
            )
        else:
            assert images is not None
            expanded, batch, ctx.pixels = expand_and_assemble_detached(
                ctx.prompt_ids, images, info, pixel_dtype=pixel_dtype, out=wire.mm_inputs
            )
            ctx.media_runs = [
                (p.offset, p.length, h)
                for p, h in zip(batch.mm_placeholders, batch.mm_hashes, strict=True)
            ]
        del wire.tokenized.input_ids[:]
        wire.tokenized.input_ids.extend(expanded)
        ctx.worker_ids = expanded

    async def forward_media_refs(
        self,
        ctx: RequestContext,
        config: GatewayConfig,
        workers: Sequence[Worker],
        plan: MediaPlan,
    ) -> None:
        wire = ctx.wire
        urls = [url for _, url in plan.parts]
        inline = gateway_must_fetch(workers)
        if inline:
            roles = ("prefill", "decode") if config.pd_disaggregation else ("regular",)
            check_data_refs_accepted(urls, workers, roles)
        refs = await build_media_refs(plan, ctx.prompt_ids, ctx.model.info, config.media)
        wire.media_refs.CopyFrom(refs)
        del refs
        if not inline:
            # Only workers that fetch under Tandem's guard may be handed these URLs, also a
            # worker registered between now and selection (dispatch/selection.candidates).
            ctx.refs_for_tandem_workers_only = has_network_refs(urls)
            return
        inlined = await inline_network_refs(wire.media_refs, config.media)
        if inlined.items:
            metrics.MEDIA_FETCH_SECONDS.observe(inlined.fetch_s)
            log.debug(
                "request %s: fetched %d image(s), %d bytes, for workers that are not Tandem "
                "workers; forwarded as data: URLs",
                ctx.request_id,
                inlined.items,
                inlined.fetched_bytes,
            )
        # The selection checks (media_ref_schemes) see the schemes as forwarded.
        ctx.media_urls = inlined.forwarded

    async def open_pair(
        self,
        ctx: RequestContext,
        pair: Pair,
        registry: WorkerRegistry,
        timeout_s: float,
        *,
        parallel: bool,
    ) -> OpenedStream:
        request = ctx.wire
        # The identity relay and the n > 1 recompute need the sequential flow, and only a
        # prefill worker that keeps KV under a gateway-minted id can run in parallel.
        if (
            parallel
            and not has_media_refs(request)
            and sampling_n(request) <= 1
            and kv_mode_for_worker(pair.prefill).accepts_minted_id
        ):
            pixels, ctx.pixels = ctx.pixels, None
            return await open_parallel(request, pair, registry, timeout_s, pixels)
        return await open_sequential(ctx, pair, registry, timeout_s)

    def fanout(self, leg: Leg, parallel: bool) -> list[tuple[str, Leg]] | None:
        width = fanout_width(leg, parallel)
        if not width:
            return None
        return [(sub.request_id, sub) for sub in fanout_requests(leg, width)]
