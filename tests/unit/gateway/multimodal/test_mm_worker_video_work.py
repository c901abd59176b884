"""The worker's ``media_refs`` videos are bounded like the gateway's (issue 30, item 1):
refused from the header before decoding, decoded on the media pool, and stopped when the
RPC ends, the decoded-bytes budget given back when the thread does."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from mm_gateway_models import Model
from tests.unit.media.video_clips import repeated_clip

from tandem.media import MediaPolicy, MediaTooLarge
from tandem.media.executor import THREAD_PREFIX
from tandem.media.video import DecodeGuard
from tandem.models.video import QwenVideoProcessor
from tandem.worker.vllm import media_refs as media_refs_module
from tandem.worker.vllm.media_refs import MediaRefsProcessor


def _worker(qwen: Model) -> MediaRefsProcessor:
    video = QwenVideoProcessor.from_model_dir(qwen.info.model_dir)

    def encode(text: str) -> list[int]:
        return qwen.tokenizer.encode(text, add_special_tokens=False).ids

    return MediaRefsProcessor(qwen.info, qwen.processor, MediaPolicy(), video=video, encode=encode)


async def test_the_issue_clip_is_refused_before_decoding(
    qwen: Model, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker = _worker(qwen)
    decoded: list[int] = []
    real = media_refs_module.decode_video
    monkeypatch.setattr(
        media_refs_module, "decode_video", lambda *a, **k: decoded.append(1) or real(*a, **k)
    )
    with pytest.raises(MediaTooLarge, match="3000 frames per second"):
        await worker._videos_within_budget([repeated_clip(30_000, 3000)])
    assert decoded == [] and worker.limits.budget.used == 0


async def test_worker_video_work_runs_on_the_media_pool(
    qwen: Model, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker = _worker(qwen)
    names: list[str] = []

    def recording(real: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            names.append(threading.current_thread().name)
            return real(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(media_refs_module, "plan_video", recording(media_refs_module.plan_video))
    monkeypatch.setattr(
        media_refs_module, "decode_video", recording(media_refs_module.decode_video)
    )
    batch = await worker._videos_within_budget([repeated_clip(40, 10)])
    assert batch is not None and len(batch) == 1
    assert len(names) == 2 and all(name.startswith(THREAD_PREFIX) for name in names), names


async def test_an_ended_rpc_stops_the_decode_and_frees_the_budget(
    qwen: Model, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker = _worker(qwen)
    started = threading.Event()
    frames: list[int] = []
    real_frame = DecodeGuard.frame

    def slow_frame(self: DecodeGuard, width: int, height: int) -> None:
        started.set()
        frames.append(1)
        time.sleep(0.002)  # 3000 frames: 6 s if the decode went on
        real_frame(self, width, height)

    monkeypatch.setattr(DecodeGuard, "frame", slow_frame)
    rpc = asyncio.ensure_future(worker._videos_within_budget([repeated_clip(3000, 30)]))
    assert await asyncio.to_thread(started.wait, 10)
    assert worker.limits.budget.used > 0
    rpc.cancel()  # the RPC's deadline, or its client cancelled
    with pytest.raises(asyncio.CancelledError):
        await rpc
    began = time.monotonic()
    while worker.limits.budget.used and time.monotonic() - began < 2:
        await asyncio.sleep(0.01)
    assert worker.limits.budget.used == 0
    assert time.monotonic() - began < 1
    assert len(frames) < 1000
