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

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Protocol

import grpc

from tandem.gateway.config import GatewayConfig
from tandem.gateway.context import RequestContext
from tandem.gateway.dispatch.streams import OpenedStream
from tandem.gateway.multimodal.plan import MediaPlan
from tandem.gateway.multimodal.process import ProcessedImages
from tandem.gateway.multimodal.videos import ProcessedVideos
from tandem.gateway.pd.selection import Pair
from tandem.gateway.types import WorkerProtocol
from tandem.gateway.workers.protocol import Leg, LegSender
from tandem.gateway.workers.registry import WorkerRegistry
from tandem.gateway.workers.worker import Worker

log = logging.getLogger("tandem.gateway")


class Backend(Protocol):
    """One worker protocol: its legs, its media, its PD pairing."""

    name: str  # the protocol's --backend name
    # Whether the legs carry each image's source bytes (TensorRT-LLM's engine processes
    # images itself): the media stage then keeps them beside the processed images.
    keeps_image_sources: bool

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
    """The backend of ``config.backend`` ("auto" not yet resolved reads as vLLM's)."""
    if config.backend == "sglang":
        from tandem.gateway.backends.sglang.backend import SglangBackend

        return SglangBackend.from_config(config)
    if config.backend == "tokenspeed":
        from tandem.gateway.backends.tokenspeed.backend import TokenSpeedBackend

        return TokenSpeedBackend.from_config(config)
    if config.backend == "trtllm":
        from tandem.gateway.backends.trtllm.backend import TrtllmBackend

        return TrtllmBackend.from_config(config)
    if config.backend == "mlx":
        from tandem.gateway.backends.mlx.backend import MlxBackend

        return MlxBackend.from_config(config)
    from tandem.gateway.backends.vllm.backend import VllmBackend

    return VllmBackend.from_config(config)


# smg's order of asking: the first service a worker answers names it.
DETECTION_ORDER: tuple[WorkerProtocol, ...] = ("sglang", "vllm", "trtllm", "tokenspeed", "mlx")
# How long the first worker may take to come up and answer (it may still be starting).
DETECT_TIMEOUT_S = 10.0


class _Detector(Protocol):
    """What detection asks of each protocol's client."""

    async def speaks_protocol(self, timeout: float) -> bool: ...

    async def close(self, grace: float | None = None) -> None: ...


async def detect_protocol(url: str, timeout_s: float) -> WorkerProtocol:
    """The protocol the worker at ``url`` speaks: each one's ``HealthCheck`` in turn, the
    first that answers (healthy or not) wins; a service it lacks answers UNIMPLEMENTED.

    Raises ConnectionError when the worker does not answer within ``timeout_s`` or speaks
    none of them.
    """
    from tandem.gateway.backends.mlx.client import MlxClient
    from tandem.gateway.backends.sglang.client import SglangClient
    from tandem.gateway.backends.tokenspeed.client import TokenSpeedClient
    from tandem.gateway.backends.trtllm.client import TrtllmClient
    from tandem.gateway.backends.vllm.client import VllmClient

    clients: dict[WorkerProtocol, Callable[[str], _Detector]] = {
        "sglang": SglangClient,
        "vllm": VllmClient,
        "trtllm": TrtllmClient,
        "tokenspeed": TokenSpeedClient,
        "mlx": MlxClient,
    }
    for protocol in DETECTION_ORDER:
        client = clients[protocol](url)
        try:
            if await client.speaks_protocol(timeout_s):
                return protocol
        except grpc.aio.AioRpcError as err:
            raise ConnectionError(
                f"worker {url} did not answer a health check: {err.code().name}: {err.details()}"
            ) from None
        finally:
            await client.close()
    raise ConnectionError(
        f"worker {url} speaks none of the worker protocols ({', '.join(DETECTION_ORDER)})"
    )


async def resolved_backend(config: GatewayConfig) -> GatewayConfig:
    """``config`` with ``--backend auto`` replaced by what the first configured worker
    speaks (vLLM's when none is configured: workers added later must speak it)."""
    if config.backend != "auto":
        return config
    urls = [*config.worker_urls, *config.prefill_urls, *config.decode_urls]
    protocol: WorkerProtocol = "vllm"
    if urls:
        try:
            protocol = await detect_protocol(urls[0], DETECT_TIMEOUT_S)
        except ConnectionError as err:
            raise SystemExit(f"tandem gateway: error: --backend auto: {err}") from None
    log.info("worker protocol: %s (--backend auto, from %s)", protocol, urls[0] if urls else "none")
    try:
        return dataclasses.replace(config, backend=protocol)
    except ValueError as err:  # a flag this protocol cannot honour: one line, by name
        raise SystemExit(f"tandem gateway: error: {err}") from None
