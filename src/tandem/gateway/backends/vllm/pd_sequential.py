"""Sequential PD dispatch (vLLM style): prefill, drain, relay the KV params, then decode.

The decode leg is built before the prefill leg is sent, and both legs are new
messages: the request in the context stays what the client asked for. The pixel
payload travels beside the messages, exists once and leaves with the prefill leg;
the decode leg never holds pixel bytes (except the Full form for n > 1, where the
decode worker must recompute the prompt itself).
"""

from __future__ import annotations

import logging
import time

from tandem.errors import TandemError
from tandem.gateway import metrics
from tandem.gateway.backends.frames import Frame, MediaIdentity
from tandem.gateway.backends.vllm.connector import (
    KvKind,
    handoff,
    identity_solicited,
    kv_mode_for_worker,
    mint_transfer_id,
    prefill_tag,
)
from tandem.gateway.backends.vllm.forms import (
    DecodeForm,
    build_decode_leg,
    decode_form,
    guard_identity_leg,
    guard_stripped_leg,
    is_stripped,
)
from tandem.gateway.backends.vllm.identity_relay import apply_prefill_media_identity
from tandem.gateway.backends.vllm.kv_release import release_prefill_kv
from tandem.gateway.backends.vllm.leg_bytes import record_leg
from tandem.gateway.context import RequestContext
from tandem.gateway.dispatch.streams import (
    OpenedStream,
    first_frame,
    relay,
    send,
    worker_pixels,
)
from tandem.gateway.pd.deferred_abort import first_decode_frame
from tandem.gateway.pd.selection import Pair
from tandem.gateway.workers.protocol import WorkerStream
from tandem.gateway.workers.registry import WorkerRegistry
from tandem.wire.requests import has_mm_inputs, prefill_leg_of, sampling_n

log = logging.getLogger("tandem.gateway.pd")


async def open_sequential(
    ctx: RequestContext, pair: Pair, registry: WorkerRegistry, timeout_s: float
) -> OpenedStream:
    request = ctx.wire
    assert request is not None
    rid = ctx.request_id
    relay_kv = sampling_n(request) <= 1
    mode = kv_mode_for_worker(pair.prefill)
    minted = (
        mint_transfer_id()
        if relay_kv and mode.kind is KvKind.MOONCAKE and (mode.accepts_minted_id)
        else None
    )
    # Decide the decode form before anything is sent: impossible pairings fail here.
    form = decode_form(request, pair.decode.language_model_only, relay_kv)
    decode_leg = build_decode_leg(request, form)
    stripped = is_stripped(request, form)
    original_has_mm = has_mm_inputs(request)

    # The prefill leg is its own message, so ``request`` (ctx.wire) keeps describing what
    # the client asked for; the pixels stay beside the messages and go with the first leg.
    prefill_leg = prefill_leg_of(request)
    tag = prefill_tag(mode, relay_kv, minted)
    if tag is not None:
        prefill_leg.kv_transfer_params_json = tag
    pixels = ctx.pixels
    # Only the Full form (n > 1: the decode worker recomputes the prompt) takes pixels too.
    decode_pixels = pixels if form is DecodeForm.FULL else None
    record_leg("prefill", prefill_leg, pixels)
    record_leg("decode", decode_leg, decode_pixels)

    started = time.perf_counter()
    try:
        stream = send(
            registry,
            pair.prefill,
            prefill_leg,
            timeout_s,
            await worker_pixels(pixels, pair.prefill),
            error_code="prefill_worker_failed_to_start",
        )
        if decode_pixels is None:
            ctx.pixels = pixels = None  # sent: pixels travel once (docs/pd-contract.md §9)
        stream, first = await first_frame(stream, pair.prefill, "prefill_worker_failed_to_start")
    except TandemError as err:
        if err.leg is not None:
            metrics.WORKER_ERRORS.labels(err.leg).inc()
        raise
    del prefill_leg
    kv_json, identity = await _drain(stream, first)
    pair.prefill_done(True)
    drained = time.perf_counter()
    metrics.PD_PREFILL_SECONDS.observe(drained - started)

    handed_off = handoff(
        mode,
        relay_kv,
        kv_json,
        minted,
        decode_leg,
        on_transfer_failure=metrics.PD_KV_TRANSFER_FAILURES.inc,
        request_id=rid,
    )
    apply_prefill_media_identity(
        decode_leg,
        identity,
        handed_off=handed_off,
        relay=relay_kv,
        solicited=identity_solicited(mode, relay_kv, minted),
        request_id=rid,
    )
    try:
        guard_stripped_leg(decode_leg, stripped, rid)
        guard_identity_leg(decode_leg, form, rid, original_has_mm=original_has_mm)
        decode_stream = send(
            registry,
            pair.decode,
            decode_leg,
            timeout_s,
            await worker_pixels(decode_pixels, pair.decode),
            error_code="decode_worker_failed_to_start",
        )
        ctx.pixels = pixels = decode_pixels = None
        # Until its first frame decode is pulling KV: a client leaving now aborts it only
        # after the pull (pd/deferred_abort.py) and frees the prefill's KV at once.
        decode_stream, decode_first = await first_decode_frame(
            decode_stream,
            pair.decode,
            "decode_worker_failed_to_start",
            lambda: release_prefill_kv(registry, pair.prefill, mode, kv_json),
        )
    except TandemError as err:
        if err.leg is not None:
            metrics.WORKER_ERRORS.labels(err.leg).inc()
        # The decode leg will never pull: free the prefill worker's KV now, not at lease end.
        await release_prefill_kv(registry, pair.prefill, mode, kv_json)
        raise
    now = time.perf_counter()
    metrics.PD_KV_TRANSFER_SECONDS.observe(now - drained)
    metrics.PD_TTFT_SECONDS.observe(now - started)
    metrics.child(metrics.PD_KV_MODE, mode.kind.value).inc()
    return OpenedStream(relay(decode_stream, decode_first, "decode_stream_error"), pair.close)


async def _drain(stream: WorkerStream, first: Frame) -> tuple[str | None, MediaIdentity | None]:
    """Read the prefill stream to its end; the last Complete frame's params win."""
    kv_json: str | None = None
    identity: MediaIdentity | None = None
    async for frame in relay(stream, first, "prefill_stream_error"):
        if frame.final:
            kv_json = frame.kv_params or kv_json
            if frame.media_identity is not None:
                identity = frame.media_identity
    return kv_json, identity
