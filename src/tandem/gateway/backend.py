"""A worker protocol as the pipeline sees it (the request-level half of the seam), and the
one place that names the protocols' folders (:func:`make_backend`).

The pipeline builds one neutral :class:`~tandem.gateway.context.RequestContext`; a
:class:`Backend` turns it into that protocol's legs (``ctx.wire``), writes the media the
media stage prepared into them, and runs a PD pair the way its protocol pairs legs. The
dispatchers, the retry loop, selection, the media stage and the answer's collection use
only this and ``workers/protocol.py``; a second protocol is a second folder beside ``vllm/``
(docs/architecture.md, "Add a worker protocol").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from tandem.gateway.config import GatewayConfig
from tandem.gateway.context import RequestContext
from tandem.gateway.dispatch.streams import OpenedStream
from tandem.gateway.multimodal.plan import MediaPlan
from tandem.gateway.multimodal.process import ProcessedImages
from tandem.gateway.multimodal.videos import ProcessedVideos
from tandem.gateway.pd.selection import Pair
from tandem.gateway.workers.protocol import Leg, LegSender
from tandem.gateway.workers.registry import WorkerRegistry
from tandem.gateway.workers.worker import Worker


class Backend(Protocol):
    """One worker protocol: its legs, its media, its PD pairing."""

    @property
    def sender(self) -> LegSender:
        """How this protocol's legs reach its workers (``workers/protocol.py``)."""
        ...

    def build_request(self, ctx: RequestContext) -> None:
        """``ctx.wire``: the tokenized prompt and sampling, before media (400s for what the
        protocol cannot carry)."""
        ...

    def attach_router_media(
        self,
        ctx: RequestContext,
        images: ProcessedImages | None,
        videos: ProcessedVideos | None,
        pixel_dtype: str,
    ) -> None:
        """Router path: expand the prompt's anchors and write the processed media into
        ``ctx.wire``; sets ``ctx.worker_ids``, ``ctx.media_runs`` and ``ctx.pixels`` (the
        pixels stay beside the message until a leg is sent)."""
        ...

    async def forward_media_refs(
        self,
        ctx: RequestContext,
        config: GatewayConfig,
        workers: Sequence[Worker],
        plan: MediaPlan,
    ) -> None:
        """Worker path: the vetted media as refs on ``ctx.wire``, fetched and inlined here
        for workers that do not fetch under Tandem's media policy."""
        ...

    async def open_pair(
        self,
        ctx: RequestContext,
        pair: Pair,
        registry: WorkerRegistry,
        timeout_s: float,
        *,
        parallel: bool,
    ) -> OpenedStream:
        """Both legs of a PD pair, up to the decode leg's first frame. ``parallel``: the
        operator prefers both legs at once where the protocol and the pair allow it."""
        ...

    def fanout(self, leg: Leg, parallel: bool) -> list[tuple[str, Leg]] | None:
        """A text request with n > 1 as n single-sample legs (request id, leg), where the
        protocol splits one; None to send it as one pair."""
        ...


def make_backend(config: GatewayConfig) -> Backend:
    """vLLM's protocol is the only one so far (its workers: vLLM's and Tandem's)."""
    from tandem.gateway.backends.vllm.backend import VllmBackend

    return VllmBackend.from_config(config)
