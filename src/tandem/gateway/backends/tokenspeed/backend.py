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
from typing import Any

from tandem.gateway.backends.scheduler.backend import SchedulerBackend
from tandem.gateway.backends.tokenspeed.epd import EncodeStage
from tandem.gateway.backends.tokenspeed.mm_items import attach_images
from tandem.gateway.backends.tokenspeed.pd import KvBootstraps, open_rooms
from tandem.gateway.backends.tokenspeed.request import build_wire_request
from tandem.gateway.backends.tokenspeed.sender import TokenSpeedSender
from tandem.gateway.config import GatewayConfig
from tandem.gateway.context import RequestContext
from tandem.gateway.dispatch.streams import OpenedStream
from tandem.gateway.multimodal.process import ProcessedImages
from tandem.gateway.pd.selection import Pair
from tandem.gateway.workers.protocol import Leg
from tandem.gateway.workers.registry import WorkerRegistry
from tandem.models.info import ModelInfo
from tandem.wire.pixels import PixelPayload
from tandem.wire.tokenspeed import tpb

UINT64_MASK = (1 << 64) - 1


class TokenSpeedBackend(SchedulerBackend):
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

    def attach_images(
        self, leg: Any, ids: Sequence[int], images: ProcessedImages, info: ModelInfo, dtype: str
    ) -> tuple[list[int], list[tuple[int, int]], PixelPayload]:
        return attach_images(leg, ids, images, info, dtype)

    def has_media(self, leg: Leg) -> bool:
        return bool(leg.mm_inputs.items)

    def single_sample(self, leg: Leg, index: int) -> Leg:
        """With its own seed ``s + index`` (wrapping), so the samples differ."""
        sub = tpb.GenerateRequest()
        sub.CopyFrom(leg)
        sub.request_id = f"{leg.request_id}-{index}"
        sub.sampling_params.n = 1
        if leg.sampling_params.HasField("sampling_seed"):
            seed = leg.sampling_params.sampling_seed + index
            sub.sampling_params.sampling_seed = seed & UINT64_MASK
        return sub

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
