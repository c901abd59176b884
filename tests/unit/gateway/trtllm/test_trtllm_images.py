"""Images over the TensorRT-LLM protocol: each image's source bytes as fetched, in prompt
order, with the prompt's placeholder runs expanded (the gateway's processor gives each
run's length), and no pixels anywhere in the message; a pixel-cache hit still carries the
bytes; video refused by name before any media work."""

from __future__ import annotations

import base64
import io
from typing import Any

import numpy as np
import pytest
from PIL import Image

from tandem.errors import TandemError
from tandem.gateway import metrics
from tandem.gateway.backends.trtllm.backend import TrtllmBackend
from tandem.gateway.config import GatewayConfig
from tandem.gateway.context import RequestContext
from tandem.gateway.endpoints.chat.schema import ChatCompletionRequest
from tandem.gateway.model import ModelHandle
from tandem.gateway.multimodal.pixel_cache import PixelCache
from tandem.gateway.multimodal.plan import plan_images
from tandem.gateway.multimodal.process import ProcessedImages, process_images
from tandem.gateway.pipeline.media import prepare_media
from tandem.gateway.pipeline.prompt import build_prompt
from tandem.media import MediaPolicy, media_hash
from tandem.models.placeholders import expand_placeholders
from tandem.wire.trtllm import trpb

BACKEND = TrtllmBackend()


@pytest.fixture(scope="module", params=["qwen_meta_dir", "llava_meta_dir"])
def handle(request: pytest.FixtureRequest) -> ModelHandle:
    name = "tiny-qwen3-vl" if request.param == "qwen_meta_dir" else "tiny-llava-1.5"
    return ModelHandle.from_dir(request.getfixturevalue(request.param), name)


def png(seed: int, size: tuple[int, int] = (48, 40)) -> bytes:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def data_url(blob: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(blob).decode()


def image_context(handle: ModelHandle, blobs: list[bytes], **fields: Any) -> RequestContext:
    parts: list[dict[str, Any]] = [
        {"type": "image_url", "image_url": {"url": data_url(b)}} for b in blobs
    ]
    parts.append({"type": "text", "text": "What is this?"})
    body = ChatCompletionRequest.model_validate(
        {"model": handle.model_id, "messages": [{"role": "user", "content": parts}], **fields}
    )
    ctx = RequestContext("chat", "req-img", body.generation(), handle)
    build_prompt(ctx)
    BACKEND.build_request(ctx)
    return ctx


async def routed(ctx: RequestContext, cache: PixelCache | None = None) -> trpb.GenerateRequest:
    config = GatewayConfig(backend="trtllm", mm_processing="auto")
    await prepare_media(ctx, config, [], backend=BACKEND, cache=cache)
    wire: trpb.GenerateRequest = ctx.wire
    return wire


async def test_each_image_goes_as_its_bytes_with_its_run_expanded(handle: ModelHandle) -> None:
    blobs = [png(1), png(2, (64, 32))]
    ctx = image_context(handle, blobs)
    prompt = list(ctx.prompt_ids)
    before = ctx.wire.max_tokens
    wire = await routed(ctx)
    assert ctx.mm_path == "router"
    assert list(wire.multimodal_input.image_data) == blobs  # as fetched, in prompt order
    # The ids as the processor expands them; the same processing, done here for the check.
    processed = await process_images(
        plan_images([data_url(b) for b in blobs]), handle.info, handle.processor, MediaPolicy()
    )
    info = handle.info
    expanded, ranges = expand_placeholders(
        prompt, info.anchor_token_id, processed.tokens_per_image, info.image_token_id
    )
    assert list(wire.tokenized.input_token_ids) == expanded == ctx.worker_ids
    assert len(expanded) > len(prompt)
    assert ctx.media_runs == [
        (offset, length, media_hash(b)) for (offset, length), b in zip(ranges, blobs, strict=True)
    ]
    # The pixels are never sent: nothing beside the message, nothing in it but the bytes.
    assert ctx.pixels is None
    assert wire.ByteSize() < sum(len(b) for b in blobs) + 8 * len(expanded) + 256
    assert processed.pixel_values is not None
    assert wire.ByteSize() < processed.pixel_values.nbytes
    # An unset limit is what the context leaves after the expanded prompt.
    assert wire.max_tokens == info.max_context - len(expanded) < before


async def test_a_pixel_cache_hit_still_carries_the_bytes(handle: ModelHandle) -> None:
    cache = PixelCache(64 << 20)
    blobs = [png(7), png(8)]
    first = await routed(image_context(handle, blobs), cache)
    hits = metrics.MM_PIXEL_CACHE_HITS._value.get()
    again_ctx = image_context(handle, [blobs[1], blobs[0]])
    again = await routed(again_ctx, cache)
    assert metrics.MM_PIXEL_CACHE_HITS._value.get() - hits == 2  # both from the cache
    assert list(first.multimodal_input.image_data) == blobs
    assert list(again.multimodal_input.image_data) == [blobs[1], blobs[0]]
    assert again_ctx.pixels is None


async def test_other_backends_keep_no_sources(handle: ModelHandle) -> None:
    plan = plan_images([data_url(png(3))])
    assert handle.processor is not None
    kept = await process_images(
        plan, handle.info, handle.processor, MediaPolicy(), keep_sources=True
    )
    plain = await process_images(plan, handle.info, handle.processor, MediaPolicy())
    assert kept.sources == [png(3)] and plain.sources is None


def processed_for(handle: ModelHandle, count: int, sources: list[bytes] | None) -> ProcessedImages:
    return ProcessedImages(
        pixel_values=np.zeros((count, 4), np.float32),
        tokens_per_image=[3] * count,
        grids={},
        patches_per_image=None,
        hashes=["a" * 64] * count,
        encoded_bytes=[4] * count,
        sources=sources,
    )


def text_ctx(handle: ModelHandle, ids: list[int]) -> RequestContext:
    body = ChatCompletionRequest.model_validate(
        {"model": handle.model_id, "messages": [{"role": "user", "content": "Hi"}]}
    )
    ctx = RequestContext("chat", "r", body.generation(), handle)
    build_prompt(ctx)
    ctx.prompt_ids = ids
    BACKEND.build_request(ctx)
    return ctx


def test_the_message_is_left_as_it_was_when_refused(handle: ModelHandle) -> None:
    anchor = handle.info.anchor_token_id
    ctx = text_ctx(handle, [1, anchor, 2])
    with pytest.raises(TandemError) as missing:
        BACKEND.attach_router_media(ctx, processed_for(handle, 1, None), None, "float32")
    assert missing.value.status == 500 and missing.value.code == "internal_error"
    with pytest.raises(TandemError) as mismatch:
        BACKEND.attach_router_media(ctx, processed_for(handle, 2, [b"a", b"b"]), None, "float32")
    assert mismatch.value.code == "multimodal_prompt_contract_mismatch"
    assert list(ctx.wire.tokenized.input_token_ids) == [1, anchor, 2]
    assert not ctx.wire.HasField("multimodal_input")
    one = processed_for(handle, 1, [b"only"])
    BACKEND.attach_router_media(ctx, one, None, "float32")
    assert list(ctx.wire.tokenized.input_token_ids) == [1, *[handle.info.image_token_id] * 3, 2]
    assert list(ctx.wire.multimodal_input.image_data) == [b"only"]
    assert one.pixel_values is None and one.sources is None  # nothing kept twice


def test_video_is_refused_by_name_before_any_media_work(qwen_meta_dir: Any) -> None:
    handle = ModelHandle.from_dir(qwen_meta_dir, "tiny-qwen3-vl")
    parts = [
        {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}},
        {"type": "text", "text": "What happens?"},
    ]
    body = ChatCompletionRequest.model_validate(
        {"model": "tiny-qwen3-vl", "messages": [{"role": "user", "content": parts}]}
    )
    ctx = RequestContext("chat", "r", body.generation(), handle)
    build_prompt(ctx)
    assert ctx.media_kinds == ["video"]
    with pytest.raises(TandemError) as info:
        BACKEND.build_request(ctx)
    assert (info.value.status, info.value.code) == (400, "multimodal_not_supported")
    assert "trtllm" in info.value.message and ctx.wire is None
