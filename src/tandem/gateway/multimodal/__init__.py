"""Image handling in the gateway: the media plan, the router/worker path decision, router-side
processing, and the checks on worker-side refs. Each worker protocol writes the outcome in
its own messages (vLLM's: ``gateway/backends/vllm/mm_inputs.py``, ``media_refs.py``).

A request with images goes:

    plan_images → check_anchors → choose_mm_path
      router: process_images (fetch ∥, decode + preprocess + hash in a thread)
              → the protocol's assembly (vLLM: expanded ids + MultimodalInputs)
      worker: check_media_refs (guarded, verbatim URLs; ids stay unexpanded)
              → if a worker is not a Tandem worker: inline_network_refs (http(s) fetched
                here under the guard, forwarded as data: URLs)
              → after selection: check_media_ref_schemes

Every refusal is a ``TandemError`` with a stable code (docs/pd-contract.md §19). Nothing here
imports torch.
"""

from tandem.gateway.multimodal.path import (
    PathDecision,
    PathReason,
    accepted_media_ref_schemes,
    check_legs_accept_media_refs,
    check_media_ref_schemes,
    choose_mm_path,
    filter_media_ref_capable,
    parse_scheme_label,
)
from tandem.gateway.multimodal.plan import MediaPlan, check_anchors, plan_images
from tandem.gateway.multimodal.process import (
    MediaTimings,
    ProcessedImages,
    media_error_to_tandem,
    process_images,
)
from tandem.gateway.multimodal.ref_checks import check_media_ref_url, check_media_refs
from tandem.gateway.types import MM_PROCESSING_MODES, MmPath, MmProcessingMode

__all__ = [
    "MM_PROCESSING_MODES",
    "MediaPlan",
    "MediaTimings",
    "MmPath",
    "MmProcessingMode",
    "PathDecision",
    "PathReason",
    "ProcessedImages",
    "accepted_media_ref_schemes",
    "check_anchors",
    "check_legs_accept_media_refs",
    "check_media_ref_schemes",
    "check_media_ref_url",
    "check_media_refs",
    "choose_mm_path",
    "filter_media_ref_capable",
    "media_error_to_tandem",
    "parse_scheme_label",
    "plan_images",
    "process_images",
]
