"""From a wire ``GenerateRequest`` to the engine's inputs, refusing what cannot be served.

Every refusal is a ``ValueError`` with a message a person can act on; the
servicer turns it into INVALID_ARGUMENT (with the error code of a ``RefusedField``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tandem.engine.block_keys import hash_salt
from tandem.engine.logprobs import MAX_TOP_LOGPROBS
from tandem.engine.refusals import RefusedField
from tandem.engine.sampling import SamplingConfig
from tandem.engine.structured_spec import Constraint, StructuredOutputError
from tandem.engine.types import MediaInputs, MediaItem
from tandem.media import media_hash
from tandem.wire.proto import GenerateRequest, Modality, MultimodalInputs, pb
from tandem.wire.requests import mm_batches
from tandem.wire.tensors import TensorCodecError, decode_tensor

LMO_REASON = (
    "this worker runs the language model only (--language-model-only) and has no vision encoder"
)
PIXEL_LESS_WITHOUT_KV = (
    "multimodal payload carries no pixel_values and no kv_transfer_params; "
    "a pixel-less leg requires remote KV"
)


@dataclass(slots=True)
class WireMedia:
    """The preprocessed media of a request as the engine takes them."""

    media: MediaInputs | None  # None for a hashes-only leg
    cache_salt: str | None
    has_pixels: bool


def prompt_ids(request: GenerateRequest) -> list[int]:
    if request.WhichOneof("input") != "tokenized":
        raise ValueError("this worker needs tokenized input (GenerateRequest.tokenized)")
    ids = list(request.tokenized.input_ids)
    if not ids:
        raise ValueError("tokenized.input_ids is empty")
    return ids


def sampling_config(
    params: pb.SamplingParams, prompt_len: int, max_context: int, vocab_size: int
) -> SamplingConfig:
    """Wire sampling parameters with vLLM's reading of unset and zero values."""
    room = max_context - prompt_len
    if room < 1:
        raise ValueError(
            f"prompt of {prompt_len} tokens leaves no room in the context of {max_context}"
        )
    max_tokens = params.max_tokens if params.HasField("max_tokens") else room
    if max_tokens < 1:
        raise ValueError("max_tokens must be at least 1")
    bad = [t for t in params.stop_token_ids if t >= vocab_size]
    if bad:
        raise ValueError(f"stop_token_ids {bad} are outside the vocabulary of {vocab_size}")
    if params.HasField("prompt_logprobs"):
        raise RefusedField("prompt_logprobs is not supported by this worker")
    logprobs = params.logprobs if params.HasField("logprobs") else None
    if logprobs is not None and not 0 <= logprobs <= MAX_TOP_LOGPROBS:
        # vLLM's -1 ("the whole vocabulary") included: a reply that size helps nobody.
        raise ValueError(f"logprobs must be in 0..{MAX_TOP_LOGPROBS}, got {logprobs}")
    bad_bias = [t for t in params.logit_bias if not 0 <= t < vocab_size]
    if bad_bias:
        raise ValueError(f"logit_bias names token ids {bad_bias[:5]} outside the vocabulary")
    for name in (
        "temperature",
        "top_p",
        "min_p",
        "repetition_penalty",
        "frequency_penalty",
        "presence_penalty",
    ):
        value = getattr(params, name)
        if not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number")
    return SamplingConfig(
        max_tokens=min(max_tokens, room),
        temperature=params.temperature if params.HasField("temperature") else 1.0,
        top_p=params.top_p or 1.0,
        top_k=params.top_k if params.top_k > 0 else 0,
        min_p=params.min_p,
        min_tokens=min(params.min_tokens, max_tokens),
        stop_token_ids=tuple(params.stop_token_ids),
        ignore_eos=params.ignore_eos,
        seed=params.seed if params.HasField("seed") else None,
        repetition_penalty=params.repetition_penalty or 1.0,
        frequency_penalty=params.frequency_penalty,
        presence_penalty=params.presence_penalty,
        logit_bias=tuple(sorted(params.logit_bias.items())),
        logprobs=logprobs,
    )


def wire_constraint(params: pb.SamplingParams) -> Constraint | None:
    """The ``constraint`` oneof as the engine takes it; None when unset.

    ``grammar_from_first_token`` needs nothing here: this engine runs no reasoning parser,
    so every constraint starts at the first generated token.
    """
    kind = params.WhichOneof("constraint")
    if kind is None:
        return None
    if kind == "json_object":
        if not params.json_object:
            raise StructuredOutputError(
                "json_object must be true when set; leave the constraint unset for free text"
            )
        return Constraint("json_object")
    if kind == "choice":
        return Constraint("choice", choices=tuple(params.choice.choices))
    if kind == "json_schema":
        return Constraint("json_schema", params.json_schema)
    if kind == "regex":
        return Constraint("regex", params.regex)
    if kind == "grammar":
        return Constraint("grammar", params.grammar)
    if kind == "structural_tag":
        return Constraint("structural_tag", params.structural_tag)
    raise StructuredOutputError(f"constraint {kind!r} is not supported by this worker")


def _media_batches(
    request: GenerateRequest,
) -> tuple[MultimodalInputs | None, MultimodalInputs | None]:
    """The request's image batch and video batch (at most one of each)."""
    image: MultimodalInputs | None = None
    video: MultimodalInputs | None = None
    for batch in mm_batches(request):
        if batch.modality == Modality.VIDEO:
            if video is not None:
                raise ValueError("expected one video batch, got several")
            video = batch
        elif batch.modality in (Modality.MODALITY_UNSPECIFIED, Modality.IMAGE):
            if image is not None:
                raise ValueError("expected one image batch, got several")
            image = batch
        else:
            name = Modality.Name(batch.modality)
            raise ValueError(f"{name} inputs are not supported by this worker")
    return image, video


def _decode(batch: MultimodalInputs) -> tuple[np.ndarray | None, dict[str, np.ndarray]]:
    key = batch.encoder_input_key if batch.HasField("encoder_input_key") else "pixel_values"
    if key != "pixel_values":
        raise ValueError(f"encoder_input_key {key!r} is not used by this model")
    try:
        pixels = decode_tensor(batch.pixel_values) if batch.HasField("pixel_values") else None
        grids = {k: decode_tensor(t) for k, t in batch.model_specific_tensors.items()}
    except TensorCodecError as exc:
        raise ValueError(str(exc)) from None
    return pixels, grids


@dataclass(slots=True)
class _Batch:
    items: list[MediaItem]
    pixels: np.ndarray | None
    grids: dict[str, np.ndarray]
    token_id: int | None


def _read_batch(batch: MultimodalInputs, modality: str, ids: list[int]) -> _Batch:
    pixels, grids = _decode(batch)
    hashes = list(batch.mm_hashes)
    placeholders = [(p.offset, p.length) for p in batch.mm_placeholders]
    for offset, length in placeholders:
        if length < 1 or offset + length > len(ids):
            raise ValueError(
                f"placeholder range ({offset}, {length}) lies outside the {len(ids)} prompt ids"
            )
    if not hashes and pixels is not None:
        # A client that sends no hashes still gets media-keyed caching.
        hashes = [f"{media_hash(pixels.tobytes())}-{i}" for i in range(len(placeholders))]
    if len(hashes) != len(placeholders):
        raise ValueError(
            f"{len(hashes)} mm_hashes for {len(placeholders)} mm_placeholders; "
            f"give one of each per {modality}"
        )
    items = [
        MediaItem(h, off, n, modality) for h, (off, n) in zip(hashes, placeholders, strict=True)
    ]
    token = batch.im_token_id if batch.HasField("im_token_id") else None
    return _Batch(items, pixels, grids, token)


def wire_media(
    request: GenerateRequest,
    ids: list[int],
    *,
    has_kv: bool,
    supports_vision: bool,
    video_token_id: int | None = None,
) -> WireMedia:
    """Read the request's preprocessed media (pixels, identity, or hashes only).

    An image batch and a video batch may come together (``mm_inputs`` and
    ``extra_mm_inputs``); their items are merged in prompt order. ``video_token_id``: the
    model's (None: it takes no video, and a video batch with placeholders is refused).
    """
    image_batch, video_batch = _media_batches(request)
    if image_batch is None and video_batch is None:
        return WireMedia(None, None, False)
    batches = [b for b in (image_batch, video_batch) if b is not None]
    hashes = [h for b in batches for h in b.mm_hashes]
    carries = any(b.HasField("pixel_values") or b.model_specific_tensors for b in batches)
    if carries and not supports_vision:
        raise ValueError(f"{LMO_REASON}: it cannot take pixel_values or grid tensors")
    if not any(b.HasField("pixel_values") for b in batches) and not has_kv:
        raise ValueError(PIXEL_LESS_WITHOUT_KV)
    if not carries and not any(b.mm_placeholders for b in batches):
        # Hashes only: the engine sees text ids; the hashes salt its prefix cache.
        return WireMedia(None, hash_salt(hashes), False)
    image = _read_batch(image_batch, "image", ids) if image_batch is not None else None
    video = _read_batch(video_batch, "video", ids) if video_batch is not None else None
    if video is not None and video.items:
        if video_token_id is None:
            raise ValueError("this model takes no video input")
        if video.token_id not in (None, video_token_id):
            raise ValueError(
                f"the video batch's im_token_id {video.token_id} is not the model's video "
                f"token {video_token_id}"
            )
    items = sorted(
        [*(image.items if image else []), *(video.items if video else [])],
        key=lambda item: item.offset,
    )
    grids = {**(image.grids if image else {}), **(video.grids if video else {})}
    media = MediaInputs(
        items=items,
        im_token_id=image.token_id if image else None,
        pixel_values=image.pixels if image else None,
        grids=grids,
        video_pixel_values=video.pixels if video else None,
    )
    has_pixels = any(b.pixels is not None for b in (image, video) if b is not None)
    return WireMedia(media, None, has_pixels)
