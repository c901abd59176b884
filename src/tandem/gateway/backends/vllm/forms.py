"""Decode-leg forms for sequential PD and the checks around them (docs/pd-contract.md §7, §11).

The form is chosen before anything is sent, so an impossible pairing (a decode
worker without a vision encoder for a request it cannot serve) fails fast with
a 400 and the prefill worker is never contacted. After the KV handoff, the
guards refuse to send a pixel-less image leg that has no KV to pull from: such
a leg would be answered as if the image were not there.
"""

from __future__ import annotations

import enum
import logging

from tandem.errors import TandemError, make_error
from tandem.wire.proto import pb
from tandem.wire.requests import (
    clone_without_mm,
    clone_without_mm_pixels,
    has_kv_transfer_params,
    has_media_refs,
    has_mm_inputs,
    has_mrope_grids,
)

log = logging.getLogger("tandem.gateway.pd")

_LMO = "the decode worker is language-model-only (it has no vision encoder)"


class DecodeForm(enum.Enum):
    """What the decode leg carries of the request's media."""

    FULL = "full"  # everything, pixels or media_refs included: decode recomputes locally
    IDENTITY_ONLY = "identity_only"  # pixel-free identity and inline grids, plus the KV
    TEXT_PLUS_HASHES = "text_plus_hashes"  # expanded ids, KV, per-batch hashes and modality


def decode_form(
    request: pb.GenerateRequest, decode_language_model_only: bool, relay_kv_params: bool
) -> DecodeForm:
    """The decode-leg form of docs/pd-contract.md §7, or a non-retryable 400 for a bad pairing.

    ``relay_kv_params`` is false when n > 1: the KV handoff is single-consumer, so
    decode must recompute the prompt and needs the full payload. The checks for a
    language-model-only decode worker run in this order: grids, refs, n.
    """
    if not decode_language_model_only:
        return DecodeForm.IDENTITY_ONLY if relay_kv_params else DecodeForm.FULL
    if has_mrope_grids(request):
        # M-RoPE positions need the grids, and a worker without an encoder is not
        # given them on the text-only path; positions would silently be wrong.
        raise _bad_pairing(
            "pd_decode_language_model_only_mrope",
            f"{_LMO} and this model needs M-RoPE grid tensors on the decode leg",
        )
    if has_media_refs(request):
        # Without an identity relay the decode worker would have to process the media.
        raise _bad_pairing(
            "pd_decode_language_model_only_media_refs",
            f"{_LMO} and the media are worker-side references it cannot process",
        )
    if has_mm_inputs(request) and not relay_kv_params:
        # n > 1 means no KV handoff, and without KV the image cannot reach decode at all.
        raise _bad_pairing(
            "pd_decode_language_model_only_n_samples",
            f"{_LMO} and an image request asks for n > 1 samples",
        )
    return DecodeForm.TEXT_PLUS_HASHES


def _bad_pairing(code: str, message: str) -> TandemError:
    return make_error(code, f"{message}; use a vision-capable decode worker", retryable=False)


def build_decode_leg(request: pb.GenerateRequest, form: DecodeForm) -> pb.GenerateRequest:
    """The decode leg for ``form``; ``request`` (the prefill leg) is left untouched."""
    if form is DecodeForm.IDENTITY_ONLY:
        return clone_without_mm_pixels(request)
    if form is DecodeForm.TEXT_PLUS_HASHES:
        return clone_without_mm(request)
    leg = pb.GenerateRequest()
    leg.CopyFrom(request)
    return leg


def is_stripped(request: pb.GenerateRequest, form: DecodeForm) -> bool:
    """True when the decode leg lost the request's media and can only learn it through KV."""
    return form is DecodeForm.TEXT_PLUS_HASHES and has_mm_inputs(request)


def guard_stripped_leg(decode_leg: pb.GenerateRequest, stripped: bool, request_id: str) -> None:
    """Refuse (502, not retried) a stripped image leg that got no KV params from prefill.

    A text request on a language-model-only decode worker is not stripped and keeps
    the local-recompute fallback.
    """
    if stripped and not has_kv_transfer_params(decode_leg):
        raise _missing_kv(request_id, "stripped multimodal decode leg")


def guard_identity_leg(
    decode_leg: pb.GenerateRequest,
    form: DecodeForm,
    request_id: str,
    *,
    original_has_mm: bool = False,
) -> None:
    """Refuse (502, not retried) an identity-only image leg that got no KV params.

    Tandem goes beyond smg here (docs/pd-contract.md §18): smg recomputes a grid-less
    identity leg without KV as text and answers it image-blind. Pass
    ``original_has_mm`` from the request before it became the prefill leg, since
    the clone drops hash-less batches; a leg that still carries ``media_refs`` is
    fine, its worker processes the media itself.
    """
    if form is not DecodeForm.IDENTITY_ONLY or has_kv_transfer_params(decode_leg):
        return
    if original_has_mm or has_mm_inputs(decode_leg):
        raise _missing_kv(request_id, "identity-only multimodal decode leg")


def _missing_kv(request_id: str, what: str) -> TandemError:
    message = f"{what} has no kv_transfer_params to pull from"
    log.error("request %s: %s", request_id, message)
    return make_error(
        "pd_decode_missing_kv_transfer_params",
        f"{message}: the prefill worker handed off no KV, so the decode worker cannot see "
        "the media",
        retryable=False,
    )
