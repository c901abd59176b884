"""Worker path: the ``media_refs`` a vLLM request forwards instead of pixels
(docs/pd-contract.md §5).

The URLs travel verbatim and the prompt keeps one unexpanded anchor per item; the worker
fetches and expands. Each URL is vetted first (``multimodal/ref_checks.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

from tandem.gateway.multimodal.plan import MediaPlan
from tandem.gateway.multimodal.ref_checks import check_media_refs
from tandem.media import MediaPolicy, Resolver
from tandem.models.info import ModelInfo
from tandem.wire.proto import Modality, pb


async def build_media_refs(
    plan: MediaPlan,
    input_ids: Sequence[int],
    info: ModelInfo,
    policy: MediaPolicy,
    *,
    resolver: Resolver | None = None,
) -> pb.MediaRefs:
    """One ``MediaRef{IMAGE|VIDEO, url}`` per part, in plan order, after the gateway's checks
    (``check_media_refs``: its 400s)."""
    await check_media_refs(plan, input_ids, info, policy, resolver=resolver)
    refs = pb.MediaRefs()
    for kind, url in plan.parts:
        refs.items.add(modality=Modality.VIDEO if kind == "video" else Modality.IMAGE, url=url)
    return refs
