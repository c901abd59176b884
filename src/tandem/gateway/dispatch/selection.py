"""Choosing workers: the candidate pool of a role, the policy's pick, the in-flight claim."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tandem.errors import make_error
from tandem.gateway import metrics
from tandem.gateway.context import RequestContext
from tandem.gateway.multimodal.path import filter_media_ref_capable
from tandem.gateway.workers.policies.base import Policy, SelectionInput
from tandem.gateway.workers.registry import WorkerRegistry
from tandem.gateway.workers.worker import Worker


def selection_input(ctx: RequestContext) -> SelectionInput:
    return SelectionInput(ctx.routing_ids(), ctx.media_runs, ctx.request_id)


def candidates(
    registry: WorkerRegistry, ctx: RequestContext, role: str, exclude: set[str]
) -> list[Worker]:
    pool = [w for w in registry.available(role, ctx.model.model_id) if w.url not in exclude]
    vision_here = role == "regular" or (role == "prefill" and not _encoded_elsewhere(registry, ctx))
    if ctx.media_urls and vision_here:
        pool = [w for w in pool if w.supports_vision]
    if ctx.mm_path == "worker":
        pool = filter_media_ref_capable(pool, lambda w: w.accepts_media_refs, role)
        if ctx.refs_for_tandem_workers_only:
            # URLs are handed only to workers that fetch under Tandem's media guard; a
            # vLLM worker registered after the media stage decided gets none of them.
            pool = [w for w in pool if w.enforces_tandem_media_policy]
    return pool


def pick(policy: Policy, pool: Sequence[Worker], ctx: RequestContext, role: str) -> Worker:
    worker = policy.select(pool, selection_input(ctx)) if pool else None
    if worker is None:
        raise make_error(
            "no_available_workers", f"no healthy {role} worker for model {ctx.model.model_id!r}"
        )
    return worker


def claim(worker: Worker, policy: Policy, ctx: RequestContext) -> Callable[[bool], None]:
    """Count the request against ``worker``; the returned callback settles it once."""
    worker.in_flight += 1
    metrics.child(metrics.WORKER_IN_FLIGHT, worker.url).set(worker.in_flight)
    settled = False

    def close(ok: bool) -> None:
        nonlocal settled
        if settled:
            return
        settled = True
        worker.in_flight -= 1
        metrics.child(metrics.WORKER_IN_FLIGHT, worker.url).set(worker.in_flight)
        if ok:
            worker.breaker.record_success()
        policy.on_request_complete(worker, selection_input(ctx))

    return close


def _encoded_elsewhere(registry: WorkerRegistry, ctx: RequestContext) -> bool:
    """E/P/D: the model has encode workers, so a prefill worker takes image features and
    needs no vision tower of its own (a language-model-only one serves image requests)."""
    return bool(registry.workers("encode", ctx.model.model_id))
