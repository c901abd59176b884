"""Aggregated dispatch: one worker serves the whole request (``--worker-urls``)."""

from __future__ import annotations

from tandem.errors import TandemError
from tandem.gateway.config import GatewayConfig
from tandem.gateway.context import RequestContext
from tandem.gateway.dispatch.retry import with_retries
from tandem.gateway.dispatch.selection import candidates, claim, pick
from tandem.gateway.dispatch.streams import OpenedStream, first_frame, relay, send, worker_pixels
from tandem.gateway.multimodal.path import check_media_ref_schemes
from tandem.gateway.workers.policies.base import Policy
from tandem.gateway.workers.registry import WorkerRegistry


class AggregatedDispatcher:
    """One worker per request (``--worker-urls``)."""

    def __init__(self, registry: WorkerRegistry, policy: Policy, config: GatewayConfig) -> None:
        self.registry = registry
        self.policy = policy
        self.config = config

    async def open(self, ctx: RequestContext) -> OpenedStream:
        assert ctx.wire is not None
        sender = self.registry.leg_sender
        sender.record_leg("aggregated", ctx.wire, ctx.pixels)
        return await with_retries(
            ctx,
            lambda tried: self._attempt(ctx, tried),
            self.config.max_retries,
            sender.rename,
            # No worker left to try is the answer, not a failure to retry.
            may_retry=lambda err: err.code != "no_available_workers",
        )

    async def _attempt(self, ctx: RequestContext, tried: set[str]) -> OpenedStream:
        wire = ctx.wire
        assert wire is not None
        pool = candidates(self.registry, ctx, "regular", tried)
        worker = pick(self.policy, pool, ctx, "worker")
        if ctx.mm_path == "worker":
            # As for a PD pair: every ref's scheme must be one the worker accepts (400).
            check_media_ref_schemes(ctx.media_urls, [worker.media_ref_schemes])
        close = claim(worker, self.policy, ctx)
        ctx.served_by = [worker.url]
        try:
            pixels = await worker_pixels(ctx.pixels, worker)
            stream = send(self.registry, worker, wire, self.config.request_timeout_s, pixels)
            del pixels
            ctx.pixels = None  # sent: the gateway keeps no pixel copy
            stream, first = await first_frame(stream, worker, "worker_error")
        except TandemError as err:
            close(False)
            if err.status >= 500:
                worker.breaker.record_failure()
            tried.add(worker.url)
            raise
        except BaseException:
            close(False)  # a timeout, a client that left, a bug: settle the count
            raise
        return OpenedStream(relay(stream, first, "worker_error"), close)
