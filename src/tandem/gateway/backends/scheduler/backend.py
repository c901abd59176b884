"""What the scheduler protocols' backends (SGLang, TokenSpeed) share.

Both take router-side preprocessed images only (no media refs: their messages carry
tensors, not URLs; ``--mm-processing worker`` is refused at start-up), keep the pixels
beside the message until the prefill leg is sent, refuse video here, and split a text
request with n > 1 into n single-sample pairs, each with its own room (its own prefill KV
to pull), while a request with images stays one pair (its pixels go once). A protocol's
backend adds how images are written into its messages and how a pair meets.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tandem.errors import make_error
from tandem.gateway.config import GatewayConfig
from tandem.gateway.context import RequestContext
from tandem.gateway.multimodal.plan import MediaPlan
from tandem.gateway.multimodal.process import ProcessedImages
from tandem.gateway.multimodal.videos import ProcessedVideos
from tandem.gateway.workers.protocol import Leg
from tandem.gateway.workers.worker import Worker
from tandem.models.info import ModelInfo
from tandem.wire.pixels import PixelPayload


class SchedulerBackend:
    """The shared half of a :class:`~tandem.gateway.backend.Backend`."""

    name: str
    keeps_image_sources = False  # the legs carry pixels, processed in the gateway

    def attach_images(
        self, leg: Any, ids: Sequence[int], images: ProcessedImages, info: ModelInfo, dtype: str
    ) -> tuple[list[int], list[tuple[int, int]], PixelPayload]:
        """Write ``images`` into ``leg`` (all but the pixels): the expanded ids, each image's
        ``(offset, length)`` and the pixels."""
        raise NotImplementedError

    def has_media(self, leg: Leg) -> bool:
        raise NotImplementedError

    def single_sample(self, leg: Leg, index: int) -> Leg:
        """Sample ``index`` of ``leg`` as a request of its own (n = 1)."""
        raise NotImplementedError

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
                f"video input is not supported over the {self.name} worker protocol here "
                "(images only)",
            )
        expanded, ranges, ctx.pixels = self.attach_images(
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
        # and --mm-processing worker is refused with these backends at start-up.
        raise make_error(
            "multimodal_not_supported",
            f"the {self.name} worker protocol carries preprocessed tensors, not media URLs: "
            "images are processed in the gateway (--mm-processing router)",
        )

    def fanout(self, leg: Leg, parallel: bool) -> list[tuple[str, Leg]] | None:
        n = max(1, leg.sampling_params.n)
        if n == 1 or self.has_media(leg):
            return None
        subs = [self.single_sample(leg, i) for i in range(n)]
        return [(sub.request_id, sub) for sub in subs]
