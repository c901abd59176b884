"""Worker path in front of workers that do not enforce Tandem's media policy (vLLM workers).

A vLLM worker fetches a ``media_refs`` URL with its own media connector: no private-address
check, redirects followed, the host name resolved again. The gateway vetted the URL before
forwarding it, but a redirect or a changed DNS answer can still lead such a worker to an
address the gateway refuses. So when any worker that could take the request is not a Tandem
worker, the gateway fetches every http(s) ref itself, under the router path's guard (every
hop vetted, connections pinned to vetted addresses, the same byte caps), and forwards the
bytes as a ``data:`` URL; the worker still decodes and preprocesses them. Tandem workers are
handed the URLs and apply their own guard (docs/operations.md, "Media URLs and vLLM
workers").
"""

from __future__ import annotations

import asyncio
import base64
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tandem.errors import make_error
from tandem.gateway.backends.grpc_client import MAX_MESSAGE_BYTES
from tandem.gateway.multimodal.process import media_error_to_tandem
from tandem.gateway.workers.worker import Worker
from tandem.media import FetchedMedia, MediaError, MediaPolicy, Resolver, fetch_all, url_scheme
from tandem.wire.proto import Modality, pb

# Schemes whose fetch can be steered to another address (redirects, DNS). file:// refs stay
# verbatim: the gateway checked their containment, and the worker reads them under its own
# --allowed-local-media-path; data: refs carry their bytes already.
NETWORK_SCHEMES = frozenset({"http", "https"})
# What a forwarded media type may look like; anything else becomes octet-stream (workers
# sniff the image format from the bytes, as the router path's decoder does).
_MEDIA_TYPE = re.compile(r"^[a-z0-9][a-z0-9!#$&^_.+-]{0,63}/[a-z0-9][a-z0-9!#$&^_.+-]{0,63}$")
_FALLBACK_MEDIA_TYPE = "application/octet-stream"
# All of a request's refs must fit in one gRPC message to the worker (the gateway's channel
# limit), with room for the prompt ids and sampling parameters.
MAX_INLINE_REQUEST_BYTES = MAX_MESSAGE_BYTES - (1 << 20)


@dataclass(frozen=True, slots=True)
class InlinedRefs:
    """What the gateway fetched for one request (for metrics and the selection checks)."""

    items: int  # refs turned into data: URLs
    fetched_bytes: int  # encoded bytes as fetched
    fetch_s: float
    # Per ref, in order: the URL as forwarded for the scheme checks; an inlined ref is
    # shortened to its data: header so the request does not hold its payload twice.
    forwarded: list[str]


def gateway_must_fetch(workers: Iterable[Worker]) -> bool:
    """Whether a worker that could take this request's refs does not enforce the policy.

    ``workers``: every registered worker of the model (healthy or not, every role), so the
    decision also holds for a retry or the other PD leg: one such worker anywhere and every
    leg gets ``data:`` URLs.
    """
    return any(w.accepts_media_refs and not w.enforces_tandem_media_policy for w in workers)


def has_network_refs(urls: Iterable[str]) -> bool:
    return any(_scheme(url) in NETWORK_SCHEMES for url in urls)


def check_data_refs_accepted(
    urls: Sequence[str], workers: Iterable[Worker], roles: Sequence[str]
) -> None:
    """400 ``media_ref_scheme_not_accepted`` before any fetch, when it is certain anyway.

    Inlined images travel as ``data:`` URLs. When every media-ref-capable worker of a role
    the request needs advertises schemes without ``data``, whichever gets selected refuses
    them, so say so now instead of fetching first. Otherwise the post-selection check on the
    selected legs decides (``check_media_ref_schemes``).
    """
    if not has_network_refs(urls):
        return
    capable = [w for w in workers if w.accepts_media_refs]
    for role in roles:
        pool = [w for w in capable if w.role == role]
        if pool and all(w.media_ref_schemes and "data" not in w.media_ref_schemes for w in pool):
            advertised = ", ".join(sorted(set().union(*(w.media_ref_schemes for w in pool))))
            raise make_error(
                "media_ref_scheme_not_accepted",
                f"the {role} workers are not Tandem workers, so the gateway fetches the "
                f"request's http(s) images itself and forwards them as data: URLs, but those "
                f"workers do not accept data: media refs (accepted: {advertised})",
            )


async def inline_network_refs(
    refs: pb.MediaRefs, policy: MediaPolicy, *, resolver: Resolver | None = None
) -> InlinedRefs:
    """Fetch every http(s) ref under ``policy`` and replace its URL by a ``data:`` URL.

    Edits ``refs`` in place (the wire request's own message, so the bytes are held once).
    A fetch failure is the router path's 400 (``media_url_refused`` for a refused hop,
    ``media_too_large``, ``multimodal_processing_failed``); nothing is forwarded then.
    """
    urls = [item.url for item in refs.items]
    indices = [i for i, url in enumerate(urls) if _scheme(url) in NETWORK_SCHEMES]
    if not indices:
        return InlinedRefs(0, 0, 0.0, urls)
    started = time.perf_counter()
    # Videos are fetched under the per-video byte cap, images under the per-image one.
    videos = {i for i in indices if refs.items[i].modality == Modality.VIDEO}
    try:
        fetched_images, fetched_videos = await asyncio.gather(
            fetch_all([urls[i] for i in indices if i not in videos], policy, resolver=resolver),
            fetch_all(
                [urls[i] for i in indices if i in videos], policy.for_video(), resolver=resolver
            ),
        )
        by_index = dict(zip([i for i in indices if i not in videos], fetched_images, strict=True))
        by_index |= dict(zip([i for i in indices if i in videos], fetched_videos, strict=True))
        fetched = [by_index[i] for i in indices]
    except MediaError as exc:
        raise media_error_to_tandem(exc) from exc
    fetch_s = time.perf_counter() - started
    fetched_bytes = sum(len(item.data) for item in fetched)
    _check_request_size(urls, indices, fetched)
    for index, item in zip(indices, fetched, strict=True):
        header = _data_header(item)
        refs.items[index].url = header + base64.b64encode(item.data).decode("ascii")
        urls[index] = header
    return InlinedRefs(len(indices), fetched_bytes, fetch_s, urls)


def _check_request_size(
    urls: Sequence[str], indices: Sequence[int], fetched: Sequence[FetchedMedia]
) -> None:
    inlined = set(indices)
    total = sum(len(url) for i, url in enumerate(urls) if i not in inlined)
    total += sum(len(_data_header(item)) + 4 * -(-len(item.data) // 3) for item in fetched)
    if total > MAX_INLINE_REQUEST_BYTES:
        raise make_error(
            "media_ref_too_large",
            f"the request's images come to {total} bytes as data: URLs, over the "
            f"{MAX_INLINE_REQUEST_BYTES}-byte limit of one worker request; send fewer or "
            "smaller images",
        )


def _data_header(item: FetchedMedia) -> str:
    media_type = (item.content_type or "").partition(";")[0].strip().lower()
    if not _MEDIA_TYPE.match(media_type):
        media_type = _FALLBACK_MEDIA_TYPE
    return f"data:{media_type};base64,"


def _scheme(url: str) -> str:
    try:
        return url_scheme(url)
    except MediaError:
        return ""
