"""PD dispatch: choose a pair, let the backend open it, retry what may be retried.

A retry is possible only while the original request is intact, that is when the
prefill leg failed to start; once a prefill ran, its pixels are gone (they
travel once) and a later failure is reported, not retried.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable

from tandem.errors import TandemError
from tandem.gateway.backend import Backend
from tandem.gateway.config import GatewayConfig
from tandem.gateway.context import RequestContext
from tandem.gateway.dispatch.retry import with_retries
from tandem.gateway.dispatch.streams import OpenedStream
from tandem.gateway.pd.merge import merge
from tandem.gateway.pd.selection import Pair, select_pair
from tandem.gateway.workers.policies.base import Policy
from tandem.gateway.workers.protocol import Leg
from tandem.gateway.workers.registry import WorkerRegistry

log = logging.getLogger("tandem.gateway.pd")


def charge_failure(pair: Pair, err: TandemError) -> None:
    """Count a server-side failure against the circuit breaker of the leg at fault.

    The leg is a field of the error (``TandemError.leg``): a prefill that answered without
    the KV handoff it was asked for is the prefill worker's fault even though the error
    surfaces while the decode leg is built.
    """
    if err.status >= 500 and err.leg is not None:
        (pair.prefill if err.leg == "prefill" else pair.decode).breaker.record_failure()


class PDDispatcher:
    def __init__(
        self,
        registry: WorkerRegistry,
        backend: Backend,
        prefill_policy: Policy,
        decode_policy: Policy,
        config: GatewayConfig,
    ) -> None:
        self.registry = registry
        self.backend = backend
        self.prefill_policy = prefill_policy
        self.decode_policy = decode_policy
        self.config = config

    @property
    def parallel(self) -> bool:
        return self.config.pd_dispatch == "parallel"

    async def open(self, ctx: RequestContext) -> OpenedStream:
        legs = self.backend.fanout(ctx.wire, self.parallel)
        if legs:
            return await self._fan_out(ctx, legs)
        return await with_retries(
            ctx,
            lambda tried: self._attempt(ctx, tried),
            self.config.max_retries,
            self.registry.leg_sender.rename,
            # Only a prefill that never started leaves nothing behind to redo elsewhere.
            may_retry=lambda err: err.code == "prefill_worker_failed_to_start",
            elsewhere="pair",
        )

    async def _attempt(self, ctx: RequestContext, tried: set[str]) -> OpenedStream:
        pair = self._pair(ctx, tried)
        ctx.served_by = [f"prefill={pair.prefill.url}", f"decode={pair.decode.url}"]
        try:
            return await self._open_pair(ctx, pair, self.parallel)
        except TandemError as err:
            pair.close(False)
            charge_failure(pair, err)
            tried.add(pair.prefill.url)
            raise
        except BaseException:
            pair.close(False)  # a timeout, a client that left, a bug: settle the count
            raise

    def _open_pair(
        self, ctx: RequestContext, pair: Pair, parallel: bool
    ) -> Awaitable[OpenedStream]:
        timeout = self.config.request_timeout_s
        return self.backend.open_pair(ctx, pair, self.registry, timeout, parallel=parallel)

    def _pair(self, ctx: RequestContext, tried: set[str]) -> Pair:
        return select_pair(self.registry, ctx, self.prefill_policy, self.decode_policy, tried)

    async def _fan_out(self, ctx: RequestContext, legs: list[tuple[str, Leg]]) -> OpenedStream:
        """n single-sample pairs for a text request; the first failure fails them all.

        Each pair runs both legs at once where its prefill worker allows it, whatever
        --pd-dispatch says: each sub-request has its own KV to pull."""
        pairs = [self._pair(ctx, set()) for _ in legs]
        ctx.served_by = [f"prefill={p.prefill.url}+decode={p.decode.url}" for p in pairs]
        tasks = [
            asyncio.ensure_future(self._open_pair(self._sub_context(ctx, rid, leg), pair, True))
            for (rid, leg), pair in zip(legs, pairs, strict=True)
        ]
        try:
            opened = list(await asyncio.gather(*tasks))
        except BaseException:
            for task in tasks:
                task.cancel()
            for task, pair in zip(tasks, pairs, strict=True):
                pair.close(False)
                if task.done() and not task.cancelled() and task.exception() is None:
                    await task.result().frames.aclose()
            raise

        def close(ok: bool) -> None:
            for pair in pairs:
                pair.close(ok)

        return OpenedStream(merge(opened), close)

    @staticmethod
    def _sub_context(ctx: RequestContext, request_id: str, leg: Leg) -> RequestContext:
        sub = RequestContext(ctx.route, request_id, ctx.request, ctx.model)
        sub.wire = leg
        return sub
