"""Helpers over ``GenerateRequest`` for the prefill/decode split (docs/pd-contract.md §7, §10).

Cloning never copies a pixel payload: every clone is built field by field and
skips the multimodal batches, whose pixel-free identity is then assembled
from the small fields only. The original request (the prefill leg) is never
modified, so its pixel bytes are neither duplicated nor moved.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from google.protobuf.message import Message

from tandem.wire.proto import GRID_KEYS, GenerateRequest, MediaIdentity, MultimodalInputs

log = logging.getLogger("tandem.wire")

_BATCH_FIELDS = frozenset({"mm_inputs", "extra_mm_inputs"})


def mm_batches(request: GenerateRequest) -> list[MultimodalInputs]:
    """The request's multimodal batches: the primary one first, then the extras."""
    batches = [request.mm_inputs] if request.HasField("mm_inputs") else []
    batches.extend(request.extra_mm_inputs)
    return batches


def has_mm_inputs(request: GenerateRequest) -> bool:
    return request.HasField("mm_inputs") or len(request.extra_mm_inputs) > 0


def has_media_refs(request: GenerateRequest) -> bool:
    return bool(request.HasField("media_refs"))


def has_mrope_grids(request: GenerateRequest) -> bool:
    """True when any batch names an M-RoPE grid tensor, whatever its payload."""
    return any(
        key in GRID_KEYS for batch in mm_batches(request) for key in batch.model_specific_tensors
    )


def has_kv_transfer_params(request: GenerateRequest) -> bool:
    return bool(request.kv_transfer_params_json) or request.HasField("kv_transfer_params")


def sampling_n(request: GenerateRequest) -> int:
    """Samples asked for; 0 or unset reads as 1."""
    return max(1, int(request.sampling_params.n))


def sanitize_sampling_for_prefill(request: GenerateRequest, max_tokens: int = 1) -> None:
    """Make ``request`` a prefill leg: one sample of ``max_tokens`` that never stops early.

    The prefill worker's job is the prompt KV; stops and min_tokens could only
    end it before the handoff is produced. Its sampled token is thrown away, so the
    output constraint and logprobs stay on the decode leg alone (see
    docs/pd-contract.md §20): the prefill worker compiles no grammar and computes no
    logprobs for nothing.
    """
    params = request.sampling_params
    params.max_tokens = max_tokens
    params.min_tokens = 0
    params.n = 1
    del params.stop[:]
    del params.stop_token_ids[:]
    params.ignore_eos = True
    params.ClearField("constraint")
    params.ClearField("logprobs")
    params.ClearField("prompt_logprobs")


def prefill_leg_of(request: GenerateRequest, max_tokens: int = 1) -> GenerateRequest:
    """A new message for the prefill leg: ``request`` with prefill sampling, not streamed.

    ``request`` itself stays as the client asked for it (sampling, stops, stream), so an
    answer built from it, or a retry on another pair, sees the client's request. The
    copy holds no pixel bytes: those travel beside the message (``tandem.wire.pixels``).
    """
    leg = GenerateRequest()
    leg.CopyFrom(request)
    sanitize_sampling_for_prefill(leg, max_tokens)
    leg.stream = False
    return leg


def _copy_fields_except(source: Message, target: Message, skip: frozenset[str]) -> None:
    """Copy every set field of ``source`` into ``target`` except those in ``skip``."""
    for descriptor, value in source.ListFields():
        name = descriptor.name
        if name in skip:
            continue
        if descriptor.is_repeated:
            getattr(target, name).extend(value)
        elif descriptor.message_type is not None:
            getattr(target, name).CopyFrom(value)
        else:
            setattr(target, name, value)


def _is_inline(batch: MultimodalInputs, key: str) -> bool:
    return (
        key in batch.model_specific_tensors
        and batch.model_specific_tensors[key].WhichOneof("payload") == "inline"
    )


def mm_identity(batch: MultimodalInputs) -> MultimodalInputs | None:
    """The pixel-free identity of a batch, or None for a hash-less batch.

    Keeps hashes, placeholders, ``im_token_id``, modality, ``encoder_input_key``
    and the inline M-RoPE grids (with their inline sizes tensors). Everything
    else, ``pixel_values`` first of all, stays behind.
    """
    if not batch.mm_hashes:
        return None
    identity = MultimodalInputs(
        mm_hashes=batch.mm_hashes,
        mm_placeholders=batch.mm_placeholders,
        modality=batch.modality,
    )
    if batch.HasField("im_token_id"):
        identity.im_token_id = batch.im_token_id
    if batch.HasField("encoder_input_key"):
        identity.encoder_input_key = batch.encoder_input_key
    for key in GRID_KEYS:
        if not _is_inline(batch, key):
            continue
        sizes_key = batch.flat_keys.get(key)
        if sizes_key is not None:
            if not _is_inline(batch, sizes_key):
                log.warning(
                    "dropping grid tensor %s from the PD decode leg: "
                    "its sizes tensor is not inline",
                    key,
                )
                continue
            identity.model_specific_tensors[sizes_key].CopyFrom(
                batch.model_specific_tensors[sizes_key]
            )
            identity.flat_keys[key] = sizes_key
        identity.model_specific_tensors[key].CopyFrom(batch.model_specific_tensors[key])
    kept = set(identity.model_specific_tensors)
    identity.batched_keys.extend(k for k in batch.batched_keys if k in kept)
    identity.keep_on_cpu_keys.extend(k for k in batch.keep_on_cpu_keys if k in kept)
    return identity


def mm_hash_identity(batch: MultimodalInputs) -> MultimodalInputs | None:
    """Hashes and modality only, for a decode worker without a vision encoder."""
    if not batch.mm_hashes:
        return None
    return MultimodalInputs(mm_hashes=batch.mm_hashes, modality=batch.modality)


def _clone_with_batches(
    request: GenerateRequest,
    to_identity: Callable[[MultimodalInputs], MultimodalInputs | None],
    skip: frozenset[str],
) -> GenerateRequest:
    clone = GenerateRequest()
    _copy_fields_except(request, clone, skip)
    identities = [i for i in map(to_identity, mm_batches(request)) if i is not None]
    if identities:
        clone.mm_inputs.CopyFrom(identities[0])
        clone.extra_mm_inputs.extend(identities[1:])
    return clone


def clone_without_mm_pixels(request: GenerateRequest) -> GenerateRequest:
    """The decode leg of an image request: everything but the pixel payload.

    ``media_refs``, ids, KV params and sampling are copied; each batch becomes
    its :func:`mm_identity`, and hash-less batches are dropped.
    """
    return _clone_with_batches(request, mm_identity, _BATCH_FIELDS)


def clone_without_mm(request: GenerateRequest) -> GenerateRequest:
    """The decode leg for a language-model-only worker.

    Expanded ids, KV params, sampling and per-batch hashes plus modality; no
    ``media_refs``, placeholders, grids or pixels.
    """
    return _clone_with_batches(request, mm_hash_identity, _BATCH_FIELDS | {"media_refs"})


def apply_media_identity(
    request: GenerateRequest, identity: MediaIdentity, request_id: str = ""
) -> bool:
    """Replace the decode leg's ``media_refs`` with the prefill worker's identity.

    All or nothing: the leg must be tokenized and the identity must carry the
    expanded prompt; otherwise the leg is left as it was (its worker will
    process the media itself) and a warning names the request.
    """
    if request.WhichOneof("input") != "tokenized" or not identity.prompt_token_ids:
        log.warning(
            "request %s: prefill worker's media identity is unusable; "
            "decode leg will reprocess media",
            request_id or request.request_id,
        )
        return False
    del request.tokenized.input_ids[:]
    request.tokenized.input_ids.extend(identity.prompt_token_ids)
    request.ClearField("mm_inputs")
    del request.extra_mm_inputs[:]
    if identity.HasField("mm_inputs"):
        request.mm_inputs.CopyFrom(identity.mm_inputs)
    request.extra_mm_inputs.extend(identity.extra_mm_inputs)
    request.ClearField("media_refs")
    return True
