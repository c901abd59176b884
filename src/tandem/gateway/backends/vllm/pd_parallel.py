"""Parallel PD dispatch for vLLM: both legs at once, meeting at a gateway-minted transfer id.

Only for prefill workers that keep KV under a transfer id the gateway chose (Tandem's
own worker, or Mooncake with an engine id); the decode worker waits, bounded, for that
KV (docs/pd-contract.md §12). The flow itself is every protocol's (``pd/parallel.py``).
"""

from __future__ import annotations

import json

from tandem.gateway import metrics
from tandem.gateway.backends.vllm.connector import (
    handoff,
    kv_mode_for_worker,
    mint_transfer_id,
    prefill_tag,
)
from tandem.gateway.backends.vllm.forms import build_decode_leg, decode_form
from tandem.gateway.backends.vllm.kv_release import release_prefill_kv
from tandem.gateway.dispatch.streams import OpenedStream
from tandem.gateway.pd.parallel import run_parallel
from tandem.gateway.pd.selection import Pair
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
    opened = await run_parallel(
        pair,
        registry,
        timeout_s,
        prefill_leg,
        decode_leg,
        pixels,
        lambda: release_prefill_kv(registry, pair.prefill, mode, minted_params),
    )
    metrics.child(metrics.PD_KV_MODE, mode.kind.value).inc()
    return opened
