"""A decode leg abandoned before its first frame is aborted only after its KV handoff.

Until the decode worker answers its first frame it is still pulling the prompt's KV
from the prefill worker. Aborting it then (a client that hung up, a request timeout)
tears the transfer down mid-way: the prefill worker keeps the KV until its lease ends
(Tandem) or the connector's abort timeout fires (vLLM's NIXL). So an abandoned decode
leg is left running in the background until its first frame arrives, at most
:data:`DEFER_ABORT_S`, and only then dropped, which sends Abort. Where the prefill
worker has a release call (Tandem) the gateway also frees its KV at once, so nothing
waits for a lease (docs/operations.md, "Client disconnects").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from tandem.gateway.backends.frames import Frame
from tandem.gateway.dispatch.streams import first_frame
from tandem.gateway.workers.protocol import WorkerStream
from tandem.gateway.workers.worker import Worker

log = logging.getLogger("tandem.gateway.pd")

# How long an abandoned decode leg may run on to finish its KV pull before Abort.
DEFER_ABORT_S = 30.0

Opening = asyncio.Future[tuple[WorkerStream, Frame]]
_pending: set[asyncio.Task[None]] = set()  # strong references until each one ends


async def first_decode_frame(
    stream: WorkerStream,
    worker: Worker,
    error_code: str,
    release_prefill: Callable[[], Awaitable[None]],
) -> tuple[WorkerStream, Frame]:
    """``first_frame`` of a decode leg whose abort, if the caller gives up, is deferred."""
    opening = asyncio.ensure_future(first_frame(stream, worker, error_code))
    try:
        return await asyncio.shield(opening)
    except asyncio.CancelledError:
        await abandon_decode(opening, release_prefill)
        raise


async def abandon_decode(
    opening: Opening, release_prefill: Callable[[], Awaitable[None]] | None = None
) -> None:
    """Drop a decode leg nobody waits for any more, once its handoff is over."""
    if opening.done():
        if not opening.cancelled() and opening.exception() is None:
            stream, _ = opening.result()
            await stream.aclose()
    else:
        task = asyncio.ensure_future(_abort_after_first(opening, DEFER_ABORT_S))
        _pending.add(task)
        task.add_done_callback(_pending.discard)
    if release_prefill is not None:
        with contextlib.suppress(Exception):
            await release_prefill()


async def _abort_after_first(opening: Opening, defer_s: float) -> None:
    try:
        done, _ = await asyncio.wait({opening}, timeout=defer_s)
        if not done:
            log.info("abandoned decode leg: no first frame within %.0f s; aborting", defer_s)
    finally:
        if not opening.done():
            opening.cancel()  # cancels the pending read, which drops the call (Abort)
        elif not opening.cancelled() and opening.exception() is None:
            stream, _ = opening.result()
            await stream.aclose()  # Abort: the client is gone
