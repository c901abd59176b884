"""The worker's media_refs limits (items, requests at once, decoded bytes), on the real
processor, and how the gateway reads the worker's refusals (docs/operations.md, "Memory
bounds for images").

This file exercises the worker side, so it imports torch-backed worker modules.
"""

from __future__ import annotations

import grpc
import pytest
from mm_gateway_models import Model
from mm_gateway_origin import data_url, png_bytes

from tandem.errors import error_from_grpc
from tandem.media import MediaError, MediaPolicy
from tandem.models.image_batch import decode_cost
from tandem.wire.proto import Modality, pb

pytest.importorskip("torch")

from tandem.worker.media_limits import MediaRefsLimitConfig, MediaRefsLimits
from tandem.worker.vllm.media_refs import MediaRefsProcessor

SMALL = png_bytes((64, 48), seed=1)


def refs_of(*blobs: bytes) -> tuple[pb.MediaRefs, list[str]]:
    urls = [data_url(blob) for blob in blobs]
    refs = pb.MediaRefs()
    for url in urls:
        refs.items.add(modality=Modality.IMAGE, url=url)
    return refs, urls


def processor(qwen: Model, **limits: int) -> MediaRefsProcessor:
    config = MediaRefsLimitConfig(**limits)
    return MediaRefsProcessor(qwen.info, qwen.processor, MediaPolicy(), MediaRefsLimits(config))


async def test_more_items_than_the_limit_is_a_client_error(qwen: Model) -> None:
    refs, urls = refs_of(SMALL, SMALL, SMALL)
    with pytest.raises(MediaError) as info:
        await processor(qwen, max_items=2).process(refs, qwen.prompt_ids(urls))
    assert info.value.code == "multimodal_too_many_items" and not info.value.retryable
    assert "--mm-max-items" in info.value.message
    refs, urls = refs_of(SMALL, SMALL)
    done = await processor(qwen, max_items=2).process(refs, qwen.prompt_ids(urls))
    assert len(done.media.items) == 2


async def test_a_busy_worker_is_saturated_and_retryable(qwen: Model) -> None:
    worker = processor(qwen, max_inflight=1)
    refs, urls = refs_of(SMALL)
    # Another request is being processed.
    with worker.limits.slot(), pytest.raises(MediaError) as info:
        await worker.process(refs, qwen.prompt_ids(urls))
    assert info.value.retryable and info.value.message.startswith("worker is saturated")
    assert worker.limits.inflight == 0
    await worker.process(refs, qwen.prompt_ids(urls))  # free again


async def test_the_decoded_bytes_budget(qwen: Model) -> None:
    cost = decode_cost([SMALL], MediaPolicy(), qwen.processor)
    worker = processor(qwen, max_decoded_bytes=cost.total)
    refs, urls = refs_of(SMALL)
    ids = qwen.prompt_ids(urls)
    held = worker.limits.budget.acquire(1)  # another request is decoding
    with pytest.raises(MediaError) as busy:
        await worker.process(refs, ids)
    assert busy.value.retryable and busy.value.message.startswith("worker is saturated")
    held.release()
    await worker.process(refs, ids)  # fits exactly once the other is done
    assert worker.limits.budget.used == 0
    two, two_urls = refs_of(SMALL, SMALL)
    with pytest.raises(MediaError) as never:
        await worker.process(two, qwen.prompt_ids(two_urls))
    assert never.value.code == "multimodal_payload_too_large" and not never.value.retryable
    assert worker.limits.budget.used == 0


def test_negative_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="--mm-max-items"):
        MediaRefsLimitConfig(max_items=-1)


def test_the_gateway_retries_a_saturated_worker_and_keeps_a_413() -> None:
    """How the gateway reads the worker's answers (docs/pd-contract.md §14, §17)."""
    saturated = error_from_grpc(
        "worker_error", grpc.StatusCode.UNAVAILABLE, "worker is saturated: 64 media_refs ..."
    )
    assert (saturated.status, saturated.retryable) == (503, True)
    too_large = error_from_grpc(
        "worker_error",
        grpc.StatusCode.INVALID_ARGUMENT,
        "the request's images take ...",
        "multimodal_payload_too_large",
    )
    assert (too_large.status, too_large.code, too_large.retryable) == (
        413,
        "multimodal_payload_too_large",
        False,
    )


def test_worker_flags_reach_the_config() -> None:
    from tandem.cli import build_parser
    from tandem.worker.cli import config_from_args

    args = ["--mm-max-items", "3", "--mm-max-inflight", "5", "--mm-max-decoded-bytes", "7"]
    config = config_from_args(build_parser().parse_args(["worker", *args]))
    assert config.media_limits == MediaRefsLimitConfig(
        max_inflight=5, max_items=3, max_decoded_bytes=7
    )
    defaults = config_from_args(build_parser().parse_args(["worker"]))
    assert defaults.media_limits == MediaRefsLimitConfig()
    assert defaults.media_limits.max_decoded_bytes == 512 << 20
