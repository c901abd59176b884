"""SGLang's protocol as a :class:`~tandem.gateway.backend.Backend`.

What it carries and what it refuses (docs/worker-protocols.md): text and images, router-side
preprocessed (no worker-side media: SGLang's messages carry pixels, not refs); PD always
with both legs at once over a bootstrap room (``--pd-dispatch`` does not apply); n > 1 as n
pairs for a text request, one request otherwise; no seed and no video (refused by name in
``request.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tandem.gateway.backends.scheduler.backend import SchedulerBackend
from tandem.gateway.backends.sglang.mm_inputs import attach_images
from tandem.gateway.backends.sglang.pd import Bootstraps, open_rooms
from tandem.gateway.backends.sglang.request import build_wire_request
from tandem.gateway.backends.sglang.sender import SglangSender
from tandem.gateway.config import GatewayConfig
from tandem.gateway.context import RequestContext
from tandem.gateway.dispatch.streams import OpenedStream
from tandem.gateway.multimodal.process import ProcessedImages
from tandem.gateway.pd.selection import Pair
from tandem.gateway.workers.protocol import Leg
from tandem.gateway.workers.registry import WorkerRegistry
from tandem.models.info import ModelInfo
from tandem.wire.pixels import PixelPayload
from tandem.wire.sglang import spb


class SglangBackend(SchedulerBackend):
    """``sglang.grpc.scheduler.SglangScheduler`` workers (SGLang's, and Tandem's)."""

    name = "sglang"

    def __init__(self, bootstraps: Bootstraps | None = None) -> None:
        self.sender = SglangSender()
        self.bootstraps = bootstraps or Bootstraps()

    @classmethod
    def from_config(cls, config: GatewayConfig) -> SglangBackend:
        return cls(Bootstraps(config.prefill_bootstrap_ports))

    def build_request(self, ctx: RequestContext) -> None:
        build_wire_request(ctx)

    def attach_images(
        self, leg: Any, ids: Sequence[int], images: ProcessedImages, info: ModelInfo, dtype: str
    ) -> tuple[list[int], list[tuple[int, int]], PixelPayload]:
        return attach_images(leg, ids, images, info, dtype)

    def has_media(self, leg: Leg) -> bool:
        return bool(leg.HasField("mm_inputs"))

    def single_sample(self, leg: Leg, index: int) -> Leg:
        sub = spb.GenerateRequest()
        sub.CopyFrom(leg)
        sub.request_id = f"{leg.request_id}-{index}"
        sub.sampling_params.n = 1
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
        return await open_rooms(ctx.wire, pair, registry, timeout_s, self.bootstraps, pixels)
