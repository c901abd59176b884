"""TensorRT-LLM's ``multimodal_input.image_data`` (each image's source bytes) as the engine's
media.

The images come as their encoded bytes (JPEG, PNG…), in prompt order, beside
``input_token_ids`` that are already expanded: each image's placeholder is its whole run
of image tokens, as smg and Tandem's gateway send it. This worker decodes and preprocesses
them with the model's own processor (``tandem.models``, the code the gateway's router path
runs, so the pixels are the same), under the worker's media limits (``--mm-max-items``,
``--mm-max-inflight``, ``--mm-max-decoded-bytes``; ``worker/media_limits.py``) and media
policy (bytes per image, the pixel cap), one image at a time.

The prompt's image tokens must be exactly the images' runs, in order: a maximal run of
image tokens holds one image, or several placed back to back, each at the length its
grid expands to. Anything else (a run too short or too long, an unexpanded anchor, more
images than runs or the reverse) is ``multimodal_prompt_contract_mismatch``.

Identity: each image's ``mm_hash`` is the worker's own BLAKE3 of its bytes (what vLLM's
``media_refs`` path uses), so it is the image itself, never a gateway's word, that salts
the prefix cache. A prompt with video tokens is refused: the protocol carries images only.
"""

from __future__ import annotations

from collections.abc import Sequence

from PIL import Image

from tandem.engine.refusals import RefusedField
from tandem.engine.types import MediaInputs, MediaItem
from tandem.media import MediaError, MediaPolicy, MediaTooLarge, decode_image, media_hash
from tandem.media.budget import run_in_thread_holding
from tandem.media.executor import run_media
from tandem.models.image_batch import image_costs, preprocess_one_at_a_time
from tandem.models.info import ModelInfo
from tandem.models.processor import ImageProcessor, PreprocessedImages
from tandem.wire.trtllm import trpb
from tandem.worker.media_limits import MediaRefsLimits, TooManyItems

FIELD = "multimodal_input.image_data"
LMO_REASON = (
    "this worker runs the language model only (--language-model-only) and has no vision encoder"
)
EXPANDED = "send input_token_ids with each image's placeholder expanded to its full run"


class PlaceholderMismatch(MediaError):
    """The images and the prompt's image-token runs do not pair up (never retried)."""

    code = "multimodal_prompt_contract_mismatch"


def image_blobs(request: trpb.GenerateRequest) -> list[bytes]:
    if not request.HasField("multimodal_input"):
        return []
    return list(request.multimodal_input.image_data)


def image_bytes(request: trpb.GenerateRequest) -> int:
    return sum(len(blob) for blob in image_blobs(request))


def image_runs(ids: Sequence[int], token: int) -> list[tuple[int, int]]:
    """``(offset, length)`` of each maximal run of ``token`` in ``ids``."""
    runs: list[tuple[int, int]] = []
    start = -1
    for pos, tid in enumerate([*ids, -1]):
        if tid == token and start < 0:
            start = pos
        elif tid != token and start >= 0:
            runs.append((start, pos - start))
            start = -1
    return runs


def place_images(
    runs: list[tuple[int, int]], tokens_per_image: Sequence[int]
) -> list[tuple[int, int]]:
    """Each image's ``(offset, length)``: the runs filled by the images in order."""
    ranges: list[tuple[int, int]] = []
    k = 0
    for start, length in runs:
        pos, end = start, start + length
        while pos < end:
            if k == len(tokens_per_image):
                raise PlaceholderMismatch(
                    f"the prompt holds image tokens from position {pos} on that none of the "
                    f"{len(tokens_per_image)} image(s) of {FIELD} fills; {EXPANDED}"
                )
            need = tokens_per_image[k]
            if pos + need > end or (k + 1 == len(tokens_per_image) and pos + need < end):
                raise PlaceholderMismatch(
                    f"{FIELD}[{k}] expands to {need} image tokens but the prompt's run of image "
                    f"tokens at position {start} holds {length}; {EXPANDED}"
                )
            ranges.append((pos, need))
            pos += need
            k += 1
    if k < len(tokens_per_image):
        raise PlaceholderMismatch(
            f"{FIELD} has {len(tokens_per_image)} image(s) but the prompt's image tokens hold "
            f"only {k}; {EXPANDED}"
        )
    return ranges


def refuse_other_media_tokens(ids: Sequence[int], model: ModelInfo) -> None:
    if model.video_token_id is not None and model.video_token_id in ids:
        raise RefusedField(
            f"the prompt holds video tokens (id {model.video_token_id}): the TensorRT-LLM "
            "protocol carries images only",
            "multimodal_not_supported",
        )


def refuse_image_tokens(ids: Sequence[int], model: ModelInfo) -> None:
    """A prompt without images must hold no image tokens (never computed as text)."""
    count = sum(1 for tid in ids if tid == model.image_token_id)
    if count:
        raise PlaceholderMismatch(
            f"the prompt holds {count} image token(s) (id {model.image_token_id}) but {FIELD} "
            "is empty; send each image's bytes"
        )


def _at(index: int, exc: MediaError) -> MediaError:
    """The same refusal, naming the image it is about."""
    return type(exc)(f"{FIELD}[{index}]: {exc.message}", retryable=exc.retryable)


class ImageBytes:
    """Decodes and preprocesses a request's images, checked against its expanded prompt."""

    def __init__(
        self,
        model: ModelInfo,
        processor: ImageProcessor,
        policy: MediaPolicy,
        limits: MediaRefsLimits,
    ) -> None:
        self.model = model
        self.processor = processor
        self.policy = policy
        self.limits = limits
        self.items_processed = 0  # in the stats, as the vLLM adapter's media_refs count

    def check(self, blobs: list[bytes], ids: Sequence[int]) -> list[tuple[int, int]]:
        """What can be refused before anything is decoded; the prompt's image-token runs."""
        limit = self.limits.config.max_items
        if limit and len(blobs) > limit:
            raise TooManyItems(
                f"{FIELD} has {len(blobs)} images; this worker takes at most {limit} a request "
                "(--mm-max-items)"
            )
        runs = image_runs(ids, self.model.image_token_id)
        if len(runs) > len(blobs) or sum(n for _, n in runs) < len(blobs):
            raise PlaceholderMismatch(
                f"{FIELD} has {len(blobs)} image(s) but the prompt holds {len(runs)} run(s) of "
                f"image tokens (id {self.model.image_token_id}); {EXPANDED}"
            )
        for k, blob in enumerate(blobs):
            if len(blob) > self.policy.max_bytes:
                raise MediaTooLarge(
                    f"{FIELD}[{k}] is {len(blob)} bytes, above this worker's cap of "
                    f"{self.policy.max_bytes} bytes an image"
                )
        return runs

    async def media(self, blobs: list[bytes], ids: Sequence[int]) -> MediaInputs:
        runs = self.check(blobs, ids)
        with self.limits.slot():  # UNAVAILABLE "worker is saturated" past --mm-max-inflight
            cost = await run_media(self._cost, blobs)
            lease = self.limits.budget.acquire(cost)  # 413, or UNAVAILABLE when saturated
            pre = await run_in_thread_holding(lease, lambda: self._preprocess(blobs))
        ranges = place_images(runs, pre.tokens_per_image)
        self.items_processed += len(blobs)
        return MediaInputs(
            items=[
                MediaItem(media_hash(blob), offset, length)
                for blob, (offset, length) in zip(blobs, ranges, strict=True)
            ],
            im_token_id=self.model.image_token_id,
            pixel_values=pre.pixel_values,
            grids=dict(pre.grids),
        )

    def _cost(self, blobs: list[bytes]) -> int:
        """Peak bytes of decoding one image at a time, from the headers alone."""
        working = outputs = 0
        for k, blob in enumerate(blobs):
            try:
                (cost,) = image_costs([blob], self.policy, self.processor)
            except MediaError as exc:
                raise _at(k, exc) from None
            working, outputs = max(working, cost.working), outputs + cost.outputs
        return working + outputs

    def _preprocess(self, blobs: list[bytes]) -> PreprocessedImages:
        index = iter(range(len(blobs)))  # preprocess_one_at_a_time decodes in order

        def decode(blob: bytes) -> Image.Image:
            k = next(index)
            try:
                return decode_image(blob, self.policy, self.processor.resize_target)
            except MediaError as exc:
                raise _at(k, exc) from None

        return preprocess_one_at_a_time(blobs, decode, self.processor)
