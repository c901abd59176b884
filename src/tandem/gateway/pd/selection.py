"""Pick a prefill worker and a decode worker for one request."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tandem.gateway.context import RequestContext
from tandem.gateway.dispatch.selection import candidates, claim, pick
from tandem.gateway.multimodal.path import check_media_ref_schemes, parse_scheme_label
from tandem.gateway.workers.policies.base import Policy
from tandem.gateway.workers.registry import WorkerRegistry
from tandem.gateway.workers.worker import Worker


@dataclass(slots=True)
class Pair:
    """The chosen workers; ``prefill_done`` settles the prefill's count once it drained,
    ``close`` settles whatever is still open (both calls are idempotent)."""

    prefill: Worker
    decode: Worker
    prefill_done: Callable[[bool], None]
    close: Callable[[bool], None]


def select_pair(
    registry: WorkerRegistry,
    ctx: RequestContext,
    prefill_policy: Policy,
    decode_policy: Policy,
    exclude: set[str],
) -> Pair:
    prefill = pick(prefill_policy, candidates(registry, ctx, "prefill", exclude), ctx, "prefill")
    decode = pick(decode_policy, candidates(registry, ctx, "decode", exclude), ctx, "decode")
    if ctx.mm_path == "worker":
        # The decode worker processes the refs itself whenever the identity cannot be relayed.
        labels = [
            parse_scheme_label(w.labels.get("mm_media_ref_schemes")) for w in (prefill, decode)
        ]
        check_media_ref_schemes(ctx.media_urls, labels)
    close_prefill = claim(prefill, prefill_policy, ctx)
    close_decode = claim(decode, decode_policy, ctx)

    def close(ok: bool) -> None:
        close_prefill(ok)
        close_decode(ok)

    return Pair(prefill, decode, close_prefill, close)
