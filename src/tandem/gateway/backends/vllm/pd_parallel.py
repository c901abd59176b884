"""Parallel PD dispatch: both legs at once, meeting at a gateway-minted transfer id.

Only for prefill workers that keep KV under a transfer id the gateway chose (Tandem's
own worker, or Mooncake with an engine id); the decode worker waits, bounded, for that
KV (docs/pd-contract.md §12). When
either leg fails to start, the error returns at once and the other is dropped,
which aborts it on its worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

from tandem.errors import TandemError
from tandem.gateway import metrics
from tandem.gateway.backends.frames import Frame
from tandem.gateway.backends.vllm.connector import (
    handoff,
    kv_mode_for_worker,
    mint_transfer_id,
    prefill_tag,
)
from tandem.gateway.backends.vllm.forms import build_decode_leg, decode_form
from tandem.gateway.backends.vllm.kv_release import release_prefill_kv
from tandem.gateway.backends.vllm.leg_bytes import record_leg
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
from tandem.gateway.workers.protocol import WorkerStream
from tandem.gateway.workers.registry import WorkerRegistry
from tandem.wire.pixels import PixelPayload
from tandem.wire.proto import GenerateRequest
from tandem.wire.requests import prefill_leg_of


async def open_parallel(
    request: GenerateRequest,
    pair: Pair,
    registry: WorkerRegistry,
    timeout_s: float,
    pixels: PixelPayload | None = None,
) -> OpenedStream:
    """Both legs at once; ``request`` is left as it is.

    ``pixels``: the request's pixel payload, sent with the prefill leg only.
    """
    mode = kv_mode_for_worker(pair.prefill)
    if not mode.accepts_minted_id:
        raise ValueError(f"prefill worker {pair.prefill.url} cannot take a minted transfer id")
    form = decode_form(request, pair.decode.language_model_only, True)
    decode_leg = build_decode_leg(request, form)
    minted = mint_transfer_id()
    minted_params = json.dumps({"transfer_id": minted})
    # Its own message: ``request`` stays what the client asked for (the answer is built
    # from it, and a retry after a failed start sends it again).
    prefill_leg = prefill_leg_of(request)
    prefill_leg.kv_transfer_params_json = prefill_tag(mode, True, minted) or ""
    handoff(mode, True, None, minted, decode_leg)
    record_leg("prefill", prefill_leg, pixels)
    record_leg("decode", decode_leg)

    started = time.perf_counter()
    prefill_call = send(
        registry,
        pair.prefill,
        prefill_leg,
        timeout_s,
        await worker_pixels(pixels, pair.prefill),
        error_code="prefill_worker_failed_to_start",
    )
    del pixels  # serialized into the prefill call: the gateway keeps no copy
    prefill = asyncio.ensure_future(
        first_frame(prefill_call, pair.prefill, "prefill_worker_failed_to_start")
    )
    decode = asyncio.ensure_future(
        start_stream(registry, pair.decode, decode_leg, timeout_s, "decode_worker_failed_to_start")
    )
    del prefill_leg, request
    try:
        # Whichever leg fails first answers at once; the other is dropped (Abort).
        await asyncio.wait({prefill, decode}, return_when=asyncio.FIRST_EXCEPTION)
        for task in (prefill, decode):
            failure = task.exception() if task.done() else None
            if failure is not None:
                raise failure
        prefill_stream, prefill_first = prefill.result()
        async for _ in relay(prefill_stream, prefill_first, "prefill_stream_error"):
            pass  # the prefill leg only has to finish; its params are the minted ones
        pair.prefill_done(True)
        decode_stream, decode_first = decode.result()
    except TandemError as err:
        if err.leg is not None:
            metrics.WORKER_ERRORS.labels(err.leg).inc()
        for task in (prefill, decode):
            await _retire(task)
        # A prefill that finished before its decode leg failed holds KV nobody will pull.
        await release_prefill_kv(registry, pair.prefill, mode, minted_params)
        raise
    except BaseException as exc:
        await _retire(prefill)
        if isinstance(exc, asyncio.CancelledError):
            # The client left (or the request timed out): a decode leg still pulling its
            # KV is aborted after the pull, and the prefill's KV is freed now.
            await abandon_decode(
                decode, lambda: release_prefill_kv(registry, pair.prefill, mode, minted_params)
            )
        else:
            await _retire(decode)
        raise
    metrics.PD_TTFT_SECONDS.observe(time.perf_counter() - started)
    metrics.PD_KV_MODE.labels(mode.kind.value).inc()
    return OpenedStream(relay(decode_stream, decode_first, "decode_stream_error"), pair.close)


async def _retire(task: asyncio.Future[tuple[WorkerStream, Frame]]) -> None:
    """Cancel a leg that is no longer wanted; if it had started, drop its stream (Abort)."""
    if not task.done():
        task.cancel()
    with contextlib.suppress(BaseException):
        stream, _ = await task
        await stream.aclose()
