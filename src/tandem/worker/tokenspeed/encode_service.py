"""``tokenspeed.grpc.encoder.TokenSpeedEncoder`` over Tandem's vision tower (``--role encode``).

An ``Encode`` names one image (its pixel rows, grid, placeholders and content hash) and one
room. The worker checks it, acknowledges it once it is queued (``accepted``), and then
computes the image's features on the encoder's own thread — or takes them from its LRU
(``--embedding-cache-mb``), keyed by the worker's own digest of the pixels and grid, never
by the gateway's hash, so two images that differ in any pixel never share features. The
features wait under ``embedding_transfer_id(room)`` in the embedding store until the
prefill worker that holds the room pulls them over ``tandem.kv.EmbeddingTransfer``
(``worker/embedding_channel.py``). An encode that fails, and an ``Encode`` refused whose
room is readable, mark the room failed, so that prefill learns why at once instead of
waiting out its timeout: a gateway that only logs a failed ``Encode`` (smg does, and then
gives up on a prefill silent for 3 s) would otherwise answer a timeout, not the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import grpc
import numpy as np

from tandem.engine.image_encoder import ImageEncoder
from tandem.engine.runner_features import image_input
from tandem.engine.runner_media import MediaLayoutError
from tandem.models.info import ModelInfo
from tandem.wire.dtypes import TensorCodecError
from tandem.wire.tokenspeed import (
    IMAGE,
    MODALITY_UNSPECIFIED,
    decode_tensor,
    embedding_transfer_id,
    epb,
    epb_grpc,
    tpb,
)
from tandem.worker.embedding_cache import EmbeddingCache, image_digest
from tandem.worker.embedding_channel import EmbeddingStore

log = logging.getLogger("tandem.worker")

GRID_KEY = "image_grid_thw"


class EncodeRefused(ValueError):
    """An ``Encode`` this worker cannot run (INVALID_ARGUMENT, the reason in words)."""


def encode_job(
    request: epb.EncodeRequest, model: ModelInfo
) -> tuple[int, np.ndarray, np.ndarray | None]:
    """The room, the pixels and the grid of a valid ``Encode``; EncodeRefused otherwise."""
    if not request.HasField("mm_inputs"):
        raise EncodeRefused("EncodeRequest.mm_inputs is required")
    if len(request.mm_inputs.items) != 1 or len(request.items) != 1:
        raise EncodeRefused(
            "EncodeRequest must contain exactly one mm item and one room assignment, got "
            f"{len(request.mm_inputs.items)} item(s) and {len(request.items)} assignment(s)"
        )
    item = request.mm_inputs.items[0]
    room = request.items[0].bootstrap_room
    if room < 0:
        raise EncodeRefused(f"bootstrap_room must be >= 0, got {room}")
    if item.modality not in (IMAGE, MODALITY_UNSPECIFIED):
        raise EncodeRefused(f"modality {item.modality} is not supported here (images only)")
    if not item.placeholders or any(p.length < 1 for p in item.placeholders):
        raise EncodeRefused("the item needs placeholders, each of length >= 1")
    if item.HasField("placeholder_token_id") and item.placeholder_token_id != model.image_token_id:
        raise EncodeRefused(
            f"placeholder_token_id {item.placeholder_token_id} is not the model's image token "
            f"{model.image_token_id}"
        )
    if not item.HasField("encoder_input"):
        raise EncodeRefused("the item carries no encoder_input (its pixel values)")
    try:
        pixels = decode_tensor(item.encoder_input)
        grid = decode_tensor(item.model_specific_tensors[GRID_KEY]) if _has_grid(item) else None
        _, tokens = image_input(pixels, grid, model)
    except (TensorCodecError, MediaLayoutError) as exc:
        raise EncodeRefused(f"the item: {exc}") from None
    placed = sum(int(p.length) for p in item.placeholders)
    if placed != tokens:
        raise EncodeRefused(
            f"the image encodes to {tokens} tokens but its placeholders hold {placed}"
        )
    return room, pixels, grid


def assigned_room(request: epb.EncodeRequest) -> int | None:
    """The one room an ``Encode`` names, if it names exactly one valid one."""
    if len(request.items) != 1 or request.items[0].bootstrap_room < 0:
        return None
    return int(request.items[0].bootstrap_room)


def _has_grid(item: tpb.MultimodalItem) -> bool:
    return GRID_KEY in item.model_specific_tensors


class EncodeService(epb_grpc.TokenSpeedEncoderServicer):
    def __init__(
        self,
        encoder: ImageEncoder,
        cache: EmbeddingCache,
        store: EmbeddingStore,
        model: ModelInfo,
        model_id: str,
    ) -> None:
        self.encoder = encoder
        self.cache = cache
        self.store = store
        self.model = model
        self.model_id = model_id
        self.accepted = 0
        self.refused = 0
        self._jobs: set[asyncio.Task[None]] = set()

    async def Encode(
        self, request: epb.EncodeRequest, context: grpc.aio.ServicerContext
    ) -> epb.EncodeResponse:
        try:
            room, pixels, grid = encode_job(request, self.model)
        except EncodeRefused as exc:
            self.refused += 1
            self._fail_room(request, str(exc))
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        # Copied out of the message: the job outlives this call's request bytes.
        pixels = np.array(pixels)
        self.accepted += 1
        job = asyncio.get_running_loop().create_task(
            self._encode(request.request_id, embedding_transfer_id(room), pixels, grid)
        )
        self._jobs.add(job)
        job.add_done_callback(self._jobs.discard)
        return epb.EncodeResponse(accepted=True)

    def _fail_room(self, request: epb.EncodeRequest, reason: str) -> None:
        """Tell the prefill waiting on a refused ``Encode``'s room why, at once."""
        room = assigned_room(request)
        if room is None:
            return
        # A room that already holds an embedding keeps it: its prefill gets what it was for.
        with contextlib.suppress(ValueError):
            self.store.fail(embedding_transfer_id(room), f"the encode worker refused it: {reason}")

    async def _encode(
        self, request_id: str, transfer_id: str, pixels: np.ndarray, grid: np.ndarray | None
    ) -> None:
        digest = image_digest(self.model_id, pixels, grid)
        try:
            features = self.cache.get(digest)
            if features is None:
                features = await self.encoder.encode(pixels, grid)
                self.cache.put(digest, features)
        except Exception as exc:  # the prefill learns why when it pulls
            log.warning("encode %s failed: %s", request_id, exc)
            self.store.fail(transfer_id, f"the encode worker could not encode the image: {exc}")
            return
        self.store.put(transfer_id, digest, features)
        self.store.expire()  # rooms no prefill came for go at lease end

    def stats(self) -> dict[str, Any]:
        return {
            "encode_requests": {"accepted": self.accepted, "refused": self.refused},
            "encoder": dict(self.encoder.counters()),
            "embedding_cache": dict(self.cache.counters()),
            "embedding_store": self.store.counters(),
        }

    async def close(self) -> None:
        for job in list(self._jobs):
            job.cancel()
        self.encoder.close()
