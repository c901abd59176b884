"""Router path, prompt half, for requests with video: expand images and videos in one pass
and write one batch per modality (docs/pd-contract.md §4, "Video").

The request's first batch (``mm_inputs``) is the image batch when there are images, else
the video batch; a video next to images travels as ``extra_mm_inputs[0]``. Both batches keep
their pixels outside the message until a leg is sent (``PixelPayload`` and its ``extra``),
raw uint8, normalized for the workers that do not normalize on device (vLLM's
``mm_device_do_normalize`` normalizes images and videos in its vision tower alike). The
video batch's ``im_token_id`` is the video token: its ranges cover the timestamps and
markers too, and the worker takes embeddings only where that token sits.
"""

from __future__ import annotations

from collections.abc import Sequence

from tandem.errors import make_error
from tandem.gateway.backends.vllm.mm_inputs import fill_image_batch, write_tensor
from tandem.gateway.multimodal.image_batch import wire_pixel_dtype
from tandem.gateway.multimodal.plan import check_anchors, check_video_anchors
from tandem.gateway.multimodal.process import ProcessedImages
from tandem.gateway.multimodal.videos import ProcessedVideos
from tandem.models.info import ModelInfo
from tandem.models.placeholders import PlaceholderCountError, expand_media
from tandem.wire.pixels import PixelPayload
from tandem.wire.proto import GenerateRequest, Modality, MultimodalInputs

VIDEO_GRID_KEY = "video_grid_thw"
VIDEO_SIZES_KEY = "patches_per_video"

MediaRun = tuple[int, int, str]  # (offset, length, hash) of one item in the expanded ids


def expand_and_assemble_media(
    input_ids: Sequence[int],
    images: ProcessedImages | None,
    videos: ProcessedVideos,
    info: ModelInfo,
    request: GenerateRequest,
    *,
    pixel_dtype: str = "float32",
) -> tuple[list[int], list[MediaRun], PixelPayload]:
    """Expanded ids, each item's run (prompt order) and the first batch's pixel payload.

    Writes ``request.mm_inputs`` (and ``extra_mm_inputs`` for a second modality).
    """
    wire_dtype = wire_pixel_dtype(pixel_dtype)
    check_anchors(input_ids, info, len(images) if images is not None else 0)
    check_video_anchors(input_ids, info, len(videos))
    image_runs = (
        [[info.image_token_id] * n for n in images.tokens_per_image] if images is not None else []
    )
    try:
        expanded, image_ranges, video_ranges = expand_media(
            input_ids,
            info.anchor_token_id,
            image_runs,
            info.video_token_id,
            videos.batch.replacements,
        )
    except PlaceholderCountError as exc:  # unreachable after the checks; kept as a guard
        raise make_error("multimodal_prompt_contract_mismatch", str(exc)) from exc
    runs = [(o, n, h) for (o, n), h in zip(video_ranges, videos.hashes, strict=True)]
    if images is not None:
        runs += [(o, n, h) for (o, n), h in zip(image_ranges, images.hashes, strict=True)]
        payload = fill_image_batch(request.mm_inputs, images, image_ranges, info, wire_dtype)
        fill_video_batch(request.extra_mm_inputs.add(), videos, video_ranges, info)
        payload.extra = _video_payload(videos, wire_dtype)
    else:
        fill_video_batch(request.mm_inputs, videos, video_ranges, info)
        payload = _video_payload(videos, wire_dtype)
    runs.sort()
    return expanded, runs, payload


def fill_video_batch(
    batch: MultimodalInputs,
    videos: ProcessedVideos,
    ranges: Sequence[tuple[int, int]],
    info: ModelInfo,
) -> None:
    """The video batch without its pixels: grids, sizes, ranges, hashes and slicing keys."""
    if info.video_token_id is None:
        raise ValueError(f"model family {info.family.name} takes no video")
    batch.Clear()
    batch.modality = Modality.VIDEO
    batch.im_token_id = info.video_token_id
    for offset, length in ranges:
        batch.mm_placeholders.add(offset=offset, length=length)
    batch.mm_hashes.extend(videos.hashes)
    write_tensor(batch.model_specific_tensors[VIDEO_GRID_KEY], videos.batch.grid)
    write_tensor(batch.model_specific_tensors[VIDEO_SIZES_KEY], videos.batch.patches_per_video)
    # The pixel tensor is flat (one row per patch), sliced per video by its patch count;
    # the workers rename it pixel_values_videos (docs/pd-contract.md §4).
    batch.batched_keys.extend((VIDEO_GRID_KEY, VIDEO_SIZES_KEY))
    batch.flat_keys["pixel_values"] = VIDEO_SIZES_KEY
    batch.keep_on_cpu_keys.append(VIDEO_GRID_KEY)


def _video_payload(videos: ProcessedVideos, wire_dtype: str) -> PixelPayload:
    batch = videos.batch
    if batch.normalize_lut is not None:
        return PixelPayload.raw(batch.pixel_values, batch.normalize_lut, wire_dtype)
    return PixelPayload.from_array(batch.pixel_values, wire_dtype)
