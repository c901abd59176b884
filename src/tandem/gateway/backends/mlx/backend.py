"""MLX's protocol as a :class:`~tandem.gateway.backend.Backend`.

What it carries and what it refuses (docs/worker-protocols.md): tokenized text, one sample
per request (a text request with n > 1 goes as n requests to the worker chosen for it, each
with its own seed, ``leg.py``), stop strings applied here, no media (refused by name, with
``multimodal_not_supported``, before any media work), no structured-output constraint and
no PD (``--pd-disaggregation`` is refused at start-up, ``open_pair`` is its guard).
"""

from __future__ import annotations

from collections.abc import Sequence

from tandem.errors import make_error
from tandem.gateway.backends.mlx.leg import MlxLeg
from tandem.gateway.backends.mlx.request import PROTOCOL, build_wire_request
from tandem.gateway.backends.mlx.sender import MlxSender
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

NO_MEDIA = (
    f"media input is not supported over the {PROTOCOL} worker protocol (it carries text "
    "only; docs/worker-protocols.md)"
)


class MlxBackend:
    """``mlx.grpc.engine.MlxEngine`` workers (MLX's servicer, and Tandem's)."""

    name = PROTOCOL
    keeps_image_sources = False  # no media at all

    def __init__(self) -> None:
        self.sender = MlxSender()

    @classmethod
    def from_config(cls, config: GatewayConfig) -> MlxBackend:
        return cls()  # config.py refused what this protocol cannot honour

    def build_request(self, ctx: RequestContext) -> None:
        build_wire_request(ctx)

    def attach_router_media(
        self,
        ctx: RequestContext,
        images: ProcessedImages | None,
        videos: ProcessedVideos | None,
        pixel_dtype: str,
    ) -> None:
        # Unreachable: build_request refused the request's media already.
        raise make_error("multimodal_not_supported", NO_MEDIA)

    async def forward_media_refs(
        self,
        ctx: RequestContext,
        config: GatewayConfig,
        workers: Sequence[Worker],
        plan: MediaPlan,
    ) -> None:
        raise make_error("multimodal_not_supported", NO_MEDIA)

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
            f"the {PROTOCOL} worker protocol has no prefill/decode pairing: serve its workers "
            "aggregated (--worker-urls)",
        )

    def fanout(self, leg: Leg, parallel: bool) -> list[tuple[str, Leg]] | None:
        """The samples of a text request as legs of their own (``MlxLeg.samples``); the
        aggregated path sends them from the client, to one worker."""
        assert isinstance(leg, MlxLeg)
        if leg.n <= 1:
            return None
        return [(sub.request_id, leg.single(sub)) for sub in leg.samples()]
