"""TokenSpeed's protocol as a :class:`~tandem.gateway.backend.Backend`.

What it carries and what it refuses (docs/worker-protocols.md): text and images, router-side
preprocessed, one ``MultimodalItem`` per image (no worker-side media: the messages carry
tensors, not refs); PD always with both legs at once over a KV bootstrap room
(``--pd-dispatch`` does not apply); n > 1 as n pairs for a text request, each with its own
room and seed, one request otherwise; video refused by name (``request.py``); E/P/D
with ``--epd-disaggregation`` (``epd.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from tandem.errors import make_error
from tandem.gateway.backends.tokenspeed.epd import EncodeStage
from tandem.gateway.backends.tokenspeed.mm_items import attach_images
from tandem.gateway.backends.tokenspeed.pd import KvBootstraps, open_rooms
from tandem.gateway.backends.tokenspeed.request import build_wire_request
from tandem.gateway.backends.tokenspeed.sender import TokenSpeedSender
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
from tandem.wire.tokenspeed import tpb

UINT64_MASK = (1 << 64) - 1


class TokenSpeedBackend:
    """``tokenspeed.grpc.scheduler.TokenSpeedScheduler`` workers (TokenSpeed's, and Tandem's)."""

    name = "tokenspeed"

    def __init__(
        self, bootstraps: KvBootstraps | None = None, encode: EncodeStage | None = None
    ) -> None:
        self.sender = TokenSpeedSender()
        self.bootstraps = bootstraps or KvBootstraps()
        self.encode = encode  # E/P/D: images go to encode workers before the pair

    @classmethod
    def from_config(cls, config: GatewayConfig) -> TokenSpeedBackend:
        encode = None
        if config.epd_disaggregation:
            encode = EncodeStage(
                config.encode_bootstrap_ports, config.encode_policy, config.max_retries + 1
            )
        return cls(KvBootstraps(config.prefill_bootstrap_ports), encode)

    def build_request(self, ctx: RequestContext) -> None:
        build_wire_request(ctx)

    def attach_router_media(
        self,
        ctx: RequestContext,
        images: ProcessedImages | None,
        videos: ProcessedVideos | None,
        pixel_dtype: str,
    ) -> None:
        if videos is not None or images is None:  # build_request refused videos already
            raise make_error(
                "multimodal_not_supported",
                "video input is not supported over the tokenspeed worker protocol here "
                "(images only)",
            )
        expanded, ranges, ctx.pixels = attach_images(
            ctx.wire, ctx.prompt_ids, images, ctx.model.info, pixel_dtype
        )
        ctx.media_runs = [
            (offset, length, h) for (offset, length), h in zip(ranges, images.hashes, strict=True)
        ]
        ctx.worker_ids = expanded

    async def forward_media_refs(
        self,
        ctx: RequestContext,
        config: GatewayConfig,
        workers: Sequence[Worker],
        plan: MediaPlan,
    ) -> None:
        # Unreachable with the path decision (these workers advertise no media processor),
        # and --mm-processing worker is refused with this backend at start-up.
        raise make_error(
            "multimodal_not_supported",
            "the tokenspeed worker protocol carries preprocessed tensors, not media URLs: "
            "images are processed in the gateway (--mm-processing router)",
        )

    async def open_pair(
        self,
        ctx: RequestContext,
        pair: Pair,
        registry: WorkerRegistry,
        timeout_s: float,
        *,
        parallel: bool,
    ) -> OpenedStream:
        pixels, ctx.pixels = ctx.pixels, None  # they travel once, with the prefill leg
        if self.encode is not None and pixels is not None and ctx.wire.mm_inputs.items:
            # E/P/D: the pixels go to the encode workers instead; the prefill leg names
            # where each item's embedding waits. A retry of the pair reuses that leg.
            if pixels.has_raw:
                pixels = await asyncio.to_thread(pixels.for_worker, False)
            leg = tpb.GenerateRequest()
            leg.CopyFrom(ctx.wire)
            encoders = await self.encode.run(leg, pixels, registry, ctx.model.model_id, timeout_s)
            pixels = None
            ctx.wire = leg
            ctx.served_by += [f"encode={url}" for url in encoders]
        return await open_rooms(ctx.wire, pair, registry, timeout_s, self.bootstraps, pixels)

    def fanout(self, leg: Leg, parallel: bool) -> list[tuple[str, Leg]] | None:
        """n > 1 on a text request: n single-sample pairs, each with its own room (a room
        is one prefill's KV) and seed ``s + i``; a request with images stays one pair (its
        pixels go once)."""
        n = max(1, leg.sampling_params.n)
        if n == 1 or leg.mm_inputs.items:
            return None
        subs: list[tuple[str, Leg]] = []
        for i in range(n):
            sub = tpb.GenerateRequest()
            sub.CopyFrom(leg)
            sub.request_id = f"{leg.request_id}-{i}"
            sub.sampling_params.n = 1
            if leg.sampling_params.HasField("sampling_seed"):
                sub.sampling_params.sampling_seed = (leg.sampling_params.sampling_seed + i) & (
                    UINT64_MASK
                )
            subs.append((sub.request_id, sub))
        return subs
