"""PD dispatch: choose a pair, run sequential or parallel dispatch, retry what may be retried.

A retry is possible only while the original request is intact, that is when the
prefill leg failed to start; once a prefill ran, its pixels are gone (they
travel once) and a later failure is reported, not retried.
"""

from __future__ import annotations

import asyncio
import logging

from tandem.errors import TandemError
from tandem.gateway.config import GatewayConfig
from tandem.gateway.context import RequestContext
from tandem.gateway.dispatch.retry import with_retries
from tandem.gateway.dispatch.streams import OpenedStream
from tandem.gateway.pd.connector import kv_mode_for_worker
from tandem.gateway.pd.fanout import fanout_requests, fanout_width
from tandem.gateway.pd.parallel import merge, open_parallel
from tandem.gateway.pd.selection import Pair, select_pair
from tandem.gateway.pd.sequential import open_sequential
from tandem.gateway.workers.policies.base import Policy
from tandem.gateway.workers.registry import WorkerRegistry
from tandem.wire.proto import pb
from tandem.wire.requests import has_media_refs, has_mm_inputs, sampling_n

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
        prefill_policy: Policy,
        decode_policy: Policy,
        config: GatewayConfig,
    ) -> None:
        self.registry = registry
        self.prefill_policy = prefill_policy
        self.decode_policy = decode_policy
        self.config = config

    @property
    def parallel(self) -> bool:
        return self.config.pd_dispatch == "parallel"

    async def open(self, ctx: RequestContext) -> OpenedStream:
        assert ctx.wire is not None
        width = fanout_width(ctx.wire, self.parallel)
        if width:
            return await self._fan_out(ctx, width)
        return await with_retries(
            ctx,
            lambda tried: self._attempt(ctx, tried),
            self.config.max_retries,
            # Only a prefill that never started leaves nothing behind to redo elsewhere.
            may_retry=lambda err: err.code == "prefill_worker_failed_to_start",
            elsewhere="pair",
        )

    async def _attempt(self, ctx: RequestContext, tried: set[str]) -> OpenedStream:
        assert ctx.wire is not None
        pair = self._pair(ctx, tried)
        ctx.served_by = [f"prefill={pair.prefill.url}", f"decode={pair.decode.url}"]
        try:
            if self._can_parallel(ctx, pair):
                pixels, ctx.pixels = ctx.pixels, None
                return await open_parallel(
                    ctx.wire, pair, self.registry, self.config.request_timeout_s, pixels
                )
            return await open_sequential(ctx, pair, self.registry, self.config.request_timeout_s)
        except TandemError as err:
            pair.close(False)
            charge_failure(pair, err)
            tried.add(pair.prefill.url)
            raise
        except BaseException:
            pair.close(False)  # a timeout, a client that left, a bug: settle the count
            raise

    def _pair(self, ctx: RequestContext, tried: set[str]) -> Pair:
        return select_pair(self.registry, ctx, self.prefill_policy, self.decode_policy, tried)

    def _can_parallel(self, ctx: RequestContext, pair: Pair) -> bool:
        request = ctx.wire
        assert request is not None
        if not self.parallel or has_media_refs(request) or sampling_n(request) > 1:
            return False  # the identity relay and n > 1 recompute need the sequential flow
        return kv_mode_for_worker(pair.prefill).accepts_minted_id

    async def _fan_out(self, ctx: RequestContext, width: int) -> OpenedStream:
        """n single-sample pairs for a text request; the first failure fails them all."""
        assert ctx.wire is not None and not has_mm_inputs(ctx.wire)
        subrequests = fanout_requests(ctx.wire, width)
        pairs = [self._pair(ctx, set()) for _ in subrequests]
        ctx.served_by = [f"prefill={p.prefill.url}+decode={p.decode.url}" for p in pairs]
        timeout = self.config.request_timeout_s
        tasks = [
            asyncio.ensure_future(open_parallel(sub, pair, self.registry, timeout))
            if kv_mode_for_worker(pair.prefill).accepts_minted_id
            else asyncio.ensure_future(self._sequential_sub(ctx, sub, pair))
            for sub, pair in zip(subrequests, pairs, strict=True)
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

    async def _sequential_sub(
        self, ctx: RequestContext, sub: pb.GenerateRequest, pair: Pair
    ) -> OpenedStream:
        sub_ctx = RequestContext(ctx.route, sub.request_id, ctx.body, ctx.model, ctx.sampling)
        sub_ctx.wire = sub
        return await open_sequential(sub_ctx, pair, self.registry, self.config.request_timeout_s)
