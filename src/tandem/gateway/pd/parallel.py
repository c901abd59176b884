"""Both legs of a PD pair at once (docs/pd-contract.md §12), whatever the protocol.

The backend builds the two legs so that they meet without the gateway relaying anything
between them (vLLM: a gateway-minted transfer id; SGLang: a bootstrap room). Whichever
leg fails to start answers at once and the other is dropped, which aborts it on its
worker. The prefill leg is read to its end (its tokens are not the answer), then the
decode leg's stream is the request's. ``release`` frees KV the prefill leg may hold for a
decode leg that will not pull it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

from tandem.errors import TandemError
from tandem.gateway import metrics
from tandem.gateway.backends.frames import Frame
from tandem.gateway.dispatch.streams import (
    OpenedStream,
    first_frame,
    relay,
    send,
    start_stream,
    worker_pixels,
)
from tandem.gateway.pd.deferred_abort import abandon_decode
from tandem.gateway.pd.selection import Pair
from tandem.gateway.workers.protocol import Leg, WorkerStream
from tandem.gateway.workers.registry import WorkerRegistry
from tandem.wire.pixels import PixelPayload


async def run_parallel(
    pair: Pair,
    registry: WorkerRegistry,
    timeout_s: float,
    prefill_leg: Leg,
    decode_leg: Leg,
    pixels: PixelPayload | None,
    release: Callable[[], Awaitable[None]],
) -> OpenedStream:
    """Send both legs, drain the prefill, return the decode stream from its first frame.

    ``pixels`` go with the prefill leg only; the gateway keeps no copy once it is sent.
    """
    sender = registry.leg_sender
    sender.record_leg("prefill", prefill_leg, pixels)
    sender.record_leg("decode", decode_leg)
    started = time.perf_counter()
    prefill_call = send(
        registry,
        pair.prefill,
        prefill_leg,
        timeout_s,
        await worker_pixels(pixels, pair.prefill),
        error_code="prefill_worker_failed_to_start",
    )
    del pixels  # serialized into the prefill call
    prefill = asyncio.ensure_future(
        first_frame(prefill_call, pair.prefill, "prefill_worker_failed_to_start")
    )
    decode = asyncio.ensure_future(
        start_stream(registry, pair.decode, decode_leg, timeout_s, "decode_worker_failed_to_start")
    )
    del prefill_leg
    try:
        # Whichever leg fails first answers at once; the other is dropped (Abort).
        await asyncio.wait({prefill, decode}, return_when=asyncio.FIRST_EXCEPTION)
        for task in (prefill, decode):
            failure = task.exception() if task.done() else None
            if failure is not None:
                raise failure
        prefill_stream, prefill_first = prefill.result()
        async for _ in relay(prefill_stream, prefill_first, "prefill_stream_error"):
            pass  # the prefill leg only has to finish
        pair.prefill_done(True)
        decode_stream, decode_first = decode.result()
    except TandemError as err:
        if err.leg is not None:
            metrics.WORKER_ERRORS.labels(err.leg).inc()
        for task in (prefill, decode):
            await _retire(task)
        # A prefill that finished before its decode leg failed holds KV nobody will pull.
        await release()
        raise
    except BaseException as exc:
        await _retire(prefill)
        if isinstance(exc, asyncio.CancelledError):
            # The client left (or the request timed out): a decode leg still pulling its
            # KV is aborted after the pull, and the prefill's KV is freed now.
            await abandon_decode(decode, release)
        else:
            await _retire(decode)
        raise
    metrics.PD_TTFT_SECONDS.observe(time.perf_counter() - started)
    return OpenedStream(relay(decode_stream, decode_first, "decode_stream_error"), pair.close)


async def _retire(task: asyncio.Future[tuple[WorkerStream, Frame]]) -> None:
    """Cancel a leg that is no longer wanted; if it had started, drop its stream (Abort)."""
    if not task.done():
        task.cancel()
    with contextlib.suppress(BaseException):
        stream, _ = await task
        await stream.aclose()
