"""Where a request's images are processed: in the gateway (router path) or by the workers
from forwarded ``media_refs`` (worker path), and the selection checks of the worker path:
docs/pd-contract.md §3 and §5.

Pure functions over plain values (flags and scheme sets), so the worker registry, the
selection policies and the pipeline can each call them with what they already hold.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

from tandem.errors import make_error
from tandem.gateway.types import MmPath, MmProcessingMode
from tandem.media import MediaRefused, describe_url, url_scheme

# The `reason` label of ``tandem_mm_processing_total`` (docs/pd-contract.md §3).
PathReason = Literal[
    "config",
    "plan_not_forwardable",
    "model_not_opted_in",
    "auto_none",
    "auto_uniform",
    "auto_mixed",
]

W = TypeVar("W")


@dataclass(frozen=True, slots=True)
class PathDecision:
    path: MmPath
    reason: PathReason


def choose_mm_path(
    mode: MmProcessingMode,
    *,
    forwardable: bool,
    worker_expandable: bool,
    workers_accept_media_refs: Sequence[bool],
) -> PathDecision:
    """Decide the path of a request that has images (docs/pd-contract.md §3, in its order).

    ``workers_accept_media_refs`` has one flag per registered worker of the model — healthy
    or not, prefill and decode alike — telling whether it takes ``media_refs`` (vLLM protocol
    over gRPC with a non-empty ``mm_processor``). In ``worker`` mode capability is enforced
    later, at selection; here only request- and model-level blockers are 400s.
    """
    if mode == "router":
        return PathDecision("router", "config")
    if mode == "worker":
        if not forwardable:
            raise make_error(
                "multimodal_not_supported",
                "--mm-processing=worker: these media parts cannot be forwarded to workers "
                "as media_refs (only image URLs without hints can)",
            )
        if not worker_expandable:
            raise make_error(
                "multimodal_worker_processing_unsupported_model",
                "--mm-processing=worker: this model's image placeholders cannot be expanded "
                "by workers; use --mm-processing=auto or router",
            )
        return PathDecision("worker", "config")
    if mode != "auto":
        raise ValueError(f"unknown --mm-processing mode {mode!r}; expected auto, router or worker")
    if not forwardable:
        return PathDecision("router", "plan_not_forwardable")
    if not worker_expandable:
        return PathDecision("router", "model_not_opted_in")
    if not workers_accept_media_refs:
        return PathDecision("router", "auto_none")
    if all(workers_accept_media_refs):
        return PathDecision("worker", "auto_uniform")
    # One incapable worker (e.g. a language-model-only decode worker) keeps media on the
    # router path, so that any pairing the selector picks can serve the request.
    return PathDecision("router", "auto_mixed")


def filter_media_ref_capable(
    pool: Sequence[W], accepts_media_refs: Callable[[W], bool], leg: str
) -> list[W]:
    """Worker path candidate filter for one leg's pool (docs/pd-contract.md §5).

    A populated pool with no capable worker is a 503 ``no_media_ref_capable_worker`` that is
    not retried (another try would meet the same pool); an empty pool passes through empty so
    the caller reports its usual ``no_available_workers``/``model_not_found``.
    """
    capable = [worker for worker in pool if accepts_media_refs(worker)]
    if pool and not capable:
        raise make_error(
            "no_media_ref_capable_worker",
            f"the request's images are processed by workers (media_refs), but none of the "
            f"{len(pool)} {leg} worker(s) advertises a media processor (mm_processor)",
        )
    return capable


def check_legs_accept_media_refs(legs_accept: Sequence[bool]) -> None:
    """Post-selection: every selected leg must take ``media_refs`` (400 otherwise)."""
    if not all(legs_accept):
        raise make_error(
            "multimodal_not_supported",
            "a selected worker cannot process media_refs (it advertises no mm_processor)",
        )


def parse_scheme_label(label: str | None) -> frozenset[str] | None:
    """``mm_media_ref_schemes`` label (``"http,https,data"``) → schemes; empty → None."""
    if not label:
        return None
    schemes = frozenset(part.strip().lower() for part in label.split(",") if part.strip())
    return schemes or None


def accepted_media_ref_schemes(
    legs_schemes: Iterable[frozenset[str] | set[str] | None],
) -> frozenset[str] | None:
    """Intersection of the schemes of every leg that advertises any; None when none does.

    A leg advertising nothing does not narrow the set (docs/pd-contract.md §5): it may be an
    older worker that predates the label, and it still applies its own allow-list when it
    fetches.
    """
    accepted: frozenset[str] | None = None
    for schemes in legs_schemes:
        if not schemes:
            continue
        lowered = frozenset(s.lower() for s in schemes)
        accepted = lowered if accepted is None else accepted & lowered
    return accepted


def check_media_ref_schemes(
    urls: Sequence[str], legs_schemes: Sequence[frozenset[str] | set[str] | None]
) -> None:
    """400 ``media_ref_scheme_not_accepted`` for a URL whose scheme some selected leg refuses.

    Both legs count: the decode worker processes the refs itself whenever the prefill
    worker's media identity cannot be relayed (e.g. n > 1).
    """
    accepted = accepted_media_ref_schemes(legs_schemes)
    if accepted is None:
        return
    for index, url in enumerate(urls):
        try:
            scheme = url_scheme(url)  # lowercased; "data" for data URLs
        except MediaRefused as exc:
            raise make_error(
                "media_ref_scheme_not_accepted", f"image {index}: {exc.message}"
            ) from exc
        if scheme not in accepted:
            raise make_error(
                "media_ref_scheme_not_accepted",
                f"image {index} ({describe_url(url)!r}) uses scheme {scheme!r}, which the "
                f"selected workers do not accept (accepted: {', '.join(sorted(accepted))})",
            )
