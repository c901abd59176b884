"""TensorRT-LLM's protocol as a :class:`~tandem.gateway.backend.Backend`.

What it carries and what it refuses (docs/worker-protocols.md): text and images, the
images as their source bytes for the engine to process (``images.py``; the gateway still
processes them for the token counts, and keeps their bytes: ``keeps_image_sources``), no
worker-side media refs (``--mm-processing worker`` is refused at start-up); n > 1 as one
request with ``num_return_sequences = n``, text and images alike (no fan-out); video
refused by name (``request.py``); no PD pairing: the answers return no context-phase
parameters a gateway could relay, so a pair is 400 ``runtime_pd_not_supported`` (the
config refuses ``--pd-disaggregation`` at start-up; this is the guard behind it).
"""

from __future__ import annotations

from collections.abc import Sequence

from tandem.errors import make_error
from tandem.gateway.backends.trtllm.images import attach_images
from tandem.gateway.backends.trtllm.request import build_wire_request, max_tokens
from tandem.gateway.backends.trtllm.sender import TrtllmSender
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


class TrtllmBackend:
    """``trtllm.TrtllmService`` workers (TensorRT-LLM's, and Tandem's)."""

    name = "trtllm"
    keeps_image_sources = True  # the engine processes the images itself, from their bytes

    def __init__(self) -> None:
        self.sender = TrtllmSender()

    @classmethod
    def from_config(cls, config: GatewayConfig) -> TrtllmBackend:
        return cls()

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
                "video input is not supported over the trtllm worker protocol (images only)",
            )
        wire = ctx.wire
        expanded, ranges = attach_images(wire, ctx.prompt_ids, images, ctx.model.info)
        ctx.media_runs = [
            (offset, length, h) for (offset, length), h in zip(ranges, images.hashes, strict=True)
        ]
        ctx.worker_ids = expanded
        ctx.pixels = None  # nothing travels beside the message
        # An unset limit is "what the context leaves": the images made the prompt longer.
        wire.max_tokens = max_tokens(ctx, len(expanded))

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
            "the trtllm worker protocol carries images as their bytes, not as media URLs: "
            "images are fetched in the gateway (--mm-processing router)",
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
        raise make_error(
            "runtime_pd_not_supported",
            "the trtllm worker protocol has no PD pairing: its answers return no "
            "context-phase parameters to hand a decode worker (docs/worker-protocols.md); "
            "serve it aggregated with --worker-urls",
        )

    def fanout(self, leg: Leg, parallel: bool) -> list[tuple[str, Leg]] | None:
        return None  # n > 1 is one request: num_return_sequences
