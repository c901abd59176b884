"""Sequential PD dispatch (vLLM style): prefill, drain, relay the KV params, then decode.

The decode leg is built before the prefill leg is sent (behaviour A): the prefill
leg is the original request itself, so the pixel payload exists once and is
gone with it; the decode leg never holds pixel bytes (except the Full form for
n > 1, where the decode worker must recompute the prompt itself).
"""

from __future__ import annotations

import logging
import time

from tandem.errors import TandemError
from tandem.gateway import metrics
from tandem.gateway.pd.connector import (
    KvKind,
    handoff,
    identity_solicited,
    kv_mode_for_worker,
    mint_transfer_id,
    prefill_tag,
)
from tandem.gateway.pd.forms import (
    DecodeForm,
    build_decode_leg,
    decode_form,
    guard_identity_leg,
    guard_stripped_leg,
    is_stripped,
)
from tandem.gateway.pd.identity_relay import apply_prefill_media_identity
from tandem.gateway.pd.leg_bytes import record_leg
from tandem.gateway.pd.release import release_prefill_kv
from tandem.gateway.pd.selection import Pair
from tandem.gateway.pipeline.context import RequestContext
from tandem.gateway.pipeline.dispatch import OpenedStream, first_frame, relay, send
from tandem.gateway.workers.registry import WorkerRegistry
from tandem.wire.kv_params import complete_kv_params_json
from tandem.wire.proto import MediaIdentity
from tandem.wire.requests import has_mm_inputs, sampling_n, sanitize_sampling_for_prefill

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

    prefill_leg = request  # moved, not copied: the pixels travel once
    saved_sampling = type(request.sampling_params)()
    saved_sampling.CopyFrom(request.sampling_params)
    saved_stream = request.stream
    sanitize_sampling_for_prefill(prefill_leg)
    prefill_leg.stream = False
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
        stream = send(registry, pair.prefill, prefill_leg, timeout_s, pixels)
        if decode_pixels is None:
            ctx.pixels = pixels = None  # sent: the pixels leave the gateway (behaviour A)
        stream, first = await first_frame(stream, pair.prefill, "prefill_worker_failed_to_start")
    except TandemError:
        metrics.WORKER_ERRORS.labels("prefill").inc()
        # Nothing was served: give the request back intact so a retry can use another pair.
        prefill_leg.sampling_params.CopyFrom(saved_sampling)
        prefill_leg.stream = saved_stream
        prefill_leg.ClearField("kv_transfer_params_json")
        raise
    ctx.wire = decode_leg
    del prefill_leg, request  # the gRPC call has serialized the pixels; let them go
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
        decode_stream = send(registry, pair.decode, decode_leg, timeout_s, decode_pixels)
        ctx.pixels = pixels = decode_pixels = None
        decode_stream, decode_first = await first_frame(
            decode_stream, pair.decode, "decode_worker_failed_to_start"
        )
    except TandemError:
        metrics.WORKER_ERRORS.labels("decode").inc()
        # The decode leg will never pull: free the prefill worker's KV now, not at lease end.
        await release_prefill_kv(pair.prefill, mode, kv_json)
        raise
    now = time.perf_counter()
    metrics.PD_KV_TRANSFER_SECONDS.observe(now - drained)
    metrics.PD_TTFT_SECONDS.observe(now - started)
    metrics.PD_KV_MODE.labels(mode.kind.value).inc()
    return OpenedStream(relay(decode_stream, decode_first, "decode_stream_error"), pair.close)


async def _drain(stream, first) -> tuple[str | None, MediaIdentity | None]:
    """Read the prefill stream to its end; the last Complete frame's params win."""
    kv_json: str | None = None
    identity: MediaIdentity | None = None
    async for frame in relay(stream, first, "prefill_stream_error"):
        if frame.HasField("complete"):
            kv_json = complete_kv_params_json(frame.complete) or kv_json
            if frame.complete.HasField("media_identity"):
                identity = frame.complete.media_identity
    return kv_json, identity
