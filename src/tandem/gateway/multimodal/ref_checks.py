"""Worker path: vet each media URL a request forwards as it is (docs/pd-contract.md §5).

Before anything is forwarded, each URL passes the same guard the router path would apply
(one media policy on every path): a URL the gateway would refuse to fetch is never handed to
a worker to fetch instead. Each worker protocol then writes the refs in its own messages.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from tandem.errors import make_error
from tandem.gateway.multimodal.plan import MediaPlan, check_anchors, check_video_anchors
from tandem.gateway.multimodal.process import media_error_to_tandem
from tandem.media import (
    MediaError,
    MediaPolicy,
    Resolver,
    check_scheme,
    check_url,
    describe_url,
    estimated_data_url_bytes,
    parse_data_url,
    resolve_local_path,
)
from tandem.models.info import ModelInfo


async def check_media_refs(
    plan: MediaPlan,
    input_ids: Sequence[int],
    info: ModelInfo,
    policy: MediaPolicy,
    *,
    resolver: Resolver | None = None,
) -> None:
    """Refuse (400) a plan whose parts the router path would refuse, without fetching.

    ``input_ids`` go to the worker unchanged (unexpanded); they must hold one anchor per
    item (400 ``multimodal_prompt_contract_mismatch``). URL refusals are the router path's
    400s (``media_url_refused``, or ``multimodal_processing_failed`` for an unresolvable
    host); a data URL whose estimated payload is over ``policy.max_bytes`` is a 400
    ``media_ref_too_large``. Nothing is fetched: http(s) hosts are only resolved and vetted.
    """
    if plan.is_empty:
        raise ValueError("check_media_refs needs a plan with at least one image")
    check_anchors(input_ids, info, len(plan))
    check_video_anchors(input_ids, info, len(plan.video_urls))
    parts = plan.parts
    results = await asyncio.gather(
        *(
            check_media_ref_url(
                url, policy.for_video() if kind == "video" else policy, resolver=resolver
            )
            for kind, url in parts
        ),
        return_exceptions=True,
    )
    # Report the first failing image in the client's order, not whichever resolved first.
    for result in results:
        if isinstance(result, BaseException):
            raise result


async def check_media_ref_url(
    url: str, policy: MediaPolicy, *, resolver: Resolver | None = None
) -> None:
    """Refuse (400) a URL that the router path would refuse, without fetching it."""
    try:
        scheme = check_scheme(url, policy)
        if scheme == "data":
            _check_data_url(url, policy)
        elif scheme == "file":
            # Same containment rule as the router path; the allowed directory is the gateway's
            # view of the shared media directory that workers read too.
            resolve_local_path(url, policy)
        else:
            # Scheme, URL shape, domain allow-list and every resolved address.
            await check_url(url, policy, resolver)
    except MediaError as exc:
        raise media_error_to_tandem(exc) from exc


def _check_data_url(url: str, policy: MediaPolicy) -> None:
    header, comma, _ = url.partition(",")
    # The header goes through the router path's own parser with an empty payload, so a
    # non-base64 or malformed data URL is refused by the same rule, without decoding the
    # (possibly large) payload here.
    parse_data_url(header + comma, policy)
    estimate = estimated_data_url_bytes(url)
    if estimate > policy.max_bytes:
        raise make_error(
            "media_ref_too_large",
            f"{describe_url(url)!r}: data URL payload is about {estimate} bytes, over the "
            f"{policy.max_bytes}-byte limit",
        )
