"""Relay the prefill worker's media identity to the decode leg (docs/pd-contract.md §10).

On the worker path both legs carry ``media_refs``. When the prefill worker
processed them and handed off its KV, the decode leg does not need to fetch and
process the media again: the identity (expanded ids, hashes, placeholders,
grids) is all it needs to attach to the pulled KV.
"""

from __future__ import annotations

import logging

from tandem.gateway.backends.frames import MediaIdentity
from tandem.wire.proto import pb
from tandem.wire.requests import apply_media_identity, has_media_refs

log = logging.getLogger("tandem.gateway.pd")


def apply_prefill_media_identity(
    decode_leg: pb.GenerateRequest,
    identity: MediaIdentity | None,
    *,
    handed_off: bool,
    relay: bool,
    solicited: bool,
    request_id: str,
) -> bool:
    """Replace the decode leg's ``media_refs`` with ``identity``; True when it was applied.

    Gates, all required:
    - ``handed_off``: without KV, decode must run the encoder itself, so it keeps its refs;
    - ``relay`` (n <= 1): legacy Mooncake hands off host/port even for n > 1, where decode
      recomputes the prompt and needs the media, so ``handed_off`` alone is not enough;
    - the leg still carries ``media_refs`` (router-path legs have nothing to replace).

    A usable identity is applied all or nothing (an unusable one leaves the leg as it
    was and warns). A missing identity warns only when ``solicited`` (the prefill leg
    carried KV params): an untagged prefill worker never builds one.
    """
    if not (handed_off and relay and has_media_refs(decode_leg)):
        return False
    if identity is not None:
        assert isinstance(identity, pb.MediaIdentity), "a vLLM prefill leg's identity"
        return apply_media_identity(decode_leg, identity, request_id)
    if solicited:
        log.warning(
            "request %s: prefill worker returned no media identity; decode leg will "
            "reprocess media",
            request_id,
        )
    return False
