"""The one retry loop every dispatcher shares.

A request is retried only while nothing has reached the client: a failure before the
worker's first frame (or a refused call) moves to a freshly selected worker, with
jittered backoff; a failure after that is reported as a stream error. An image request
whose pixels were sent once is not sent again (they travel once). See
docs/pd-contract.md for which PD failures may be retried.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable

from tandem.errors import TandemError
from tandem.gateway import metrics
from tandem.gateway.context import RequestContext
from tandem.gateway.dispatch.streams import OpenedStream
from tandem.gateway.workers.protocol import Leg

log = logging.getLogger("tandem.gateway.dispatch")

# One try: it is handed the workers that already failed this request (to leave out), adds
# the one it used when it fails, and settles its own accounting either way.
Attempt = Callable[[set[str]], Awaitable[OpenedStream]]


async def with_retries(
    ctx: RequestContext,
    attempt: Attempt,
    max_retries: int,
    rename: Callable[[Leg, str], None],
    may_retry: Callable[[TandemError], bool] = lambda err: True,
    elsewhere: str = "worker",
) -> OpenedStream:
    """``attempt`` until one opens a stream, or the failure is final; ``rename`` is the worker
    protocol's (``LegSender.rename``)."""
    tried: set[str] = set()
    retries = 0
    while True:
        try:
            return await attempt(tried)
        except TandemError as err:
            resendable = not ctx.had_pixels  # pixels already sent are gone
            if not (err.retryable and resendable and retries < max_retries and may_retry(err)):
                raise
            retries += 1
            log.warning("request %s: %s; retrying on another %s", ctx.request_id, err, elsewhere)
            next_attempt(ctx, retries, rename)
            metrics.RETRIES.labels(ctx.route).inc()
            await backoff(retries)


def next_attempt(ctx: RequestContext, attempt: int, rename: Callable[[Leg, str], None]) -> None:
    """Give a retried request a fresh backend id: the failed try's legs were dropped, and
    the Abort a worker got for that id (or remembers, if it arrived first) must not
    end the retry. Worker logs still show the gateway's id, with a ``-retryN`` suffix."""
    assert ctx.wire is not None
    rename(ctx.wire, f"{ctx.request_id}-retry{attempt}")


async def backoff(attempt: int) -> None:
    await asyncio.sleep(random.uniform(0.5, 1.0) * min(0.05 * 2**attempt, 1.0))
