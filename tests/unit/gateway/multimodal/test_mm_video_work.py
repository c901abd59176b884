"""The router path's videos are bounded by decode work (issue 30, item 1): a clip whose
header claims too much is refused before decoding, the work runs on the media pool, and a
request given up mid-decode stops its thread, which then gives back its share."""

from __future__ import annotations

import asyncio
import base64
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from mm_gateway_models import Model
from tests.unit.media.video_clips import repeated_clip

from tandem.errors import TandemError
from tandem.gateway.admission import PixelBudget
from tandem.gateway.multimodal import videos as videos_module
from tandem.gateway.multimodal.videos import process_videos
from tandem.media import MediaPolicy
from tandem.media.executor import THREAD_PREFIX
from tandem.media.video import DecodeGuard
from tandem.models.video import QwenVideoProcessor


def _encoder(model: Model) -> Callable[[str], list[int]]:
    return lambda text: model.tokenizer.encode(text, add_special_tokens=False).ids


def _url(clip: bytes) -> str:
    return "data:video/mp4;base64," + base64.b64encode(clip).decode()


def _recording(calls: list[str], real: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls.append(threading.current_thread().name)
        return real(*args, **kwargs)

    return wrapper


async def test_the_issue_clip_is_refused_before_decoding(
    qwen: Model, monkeypatch: pytest.MonkeyPatch
) -> None:
    video = QwenVideoProcessor.from_model_dir(qwen.info.model_dir)
    decoded: list[str] = []
    monkeypatch.setattr(
        videos_module, "decode_video", _recording(decoded, videos_module.decode_video)
    )
    budget = PixelBudget(1 << 30)
    clip = repeated_clip(30_000, 3000)  # 30 000 frames declaring 3000 fps: "10 s"
    with pytest.raises(TandemError) as caught:
        await process_videos(
            [_url(clip)], qwen.info, video, MediaPolicy(), _encoder(qwen), lease=budget.lease()
        )
    assert (caught.value.status, caught.value.code) == (400, "media_too_large")
    assert "3000 frames per second" in caught.value.message
    assert decoded == [] and budget.used == 0


async def test_video_work_runs_on_the_media_pool(
    qwen: Model, monkeypatch: pytest.MonkeyPatch
) -> None:
    video = QwenVideoProcessor.from_model_dir(qwen.info.model_dir)
    planned: list[str] = []
    decoded: list[str] = []
    monkeypatch.setattr(videos_module, "plan_video", _recording(planned, videos_module.plan_video))
    monkeypatch.setattr(
        videos_module, "decode_video", _recording(decoded, videos_module.decode_video)
    )
    done = await process_videos(
        [_url(repeated_clip(40, 10))], qwen.info, video, MediaPolicy(), _encoder(qwen)
    )
    assert len(done) == 1
    assert planned and decoded
    assert all(name.startswith(THREAD_PREFIX) for name in planned + decoded), planned + decoded


async def test_a_request_given_up_mid_decode_stops_its_thread(
    qwen: Model, monkeypatch: pytest.MonkeyPatch
) -> None:
    video = QwenVideoProcessor.from_model_dir(qwen.info.model_dir)
    started = threading.Event()
    real_frame = DecodeGuard.frame

    def slow_frame(self: DecodeGuard, width: int, height: int) -> None:
        started.set()
        time.sleep(0.002)  # 3000 frames: 6 s if the decode went on
        real_frame(self, width, height)

    monkeypatch.setattr(DecodeGuard, "frame", slow_frame)
    budget = PixelBudget(1 << 30)
    lease = budget.lease()
    clip = repeated_clip(3000, 30)  # 100 s of 64x48
    request = asyncio.ensure_future(
        process_videos([_url(clip)], qwen.info, video, MediaPolicy(), _encoder(qwen), lease=lease)
    )
    assert await asyncio.to_thread(started.wait, 10)
    request.cancel()  # a timeout or a client gone
    with pytest.raises(asyncio.CancelledError):
        await request
    began = time.monotonic()
    while budget.used > lease.nbytes and time.monotonic() - began < 2:
        await asyncio.sleep(0.01)
    # The decoded frames' share came back once the thread ended, well before 6 s; what
    # is left is the patches' share, which the request itself releases.
    assert budget.used == lease.nbytes
    assert time.monotonic() - began < 1
    lease.release()
    assert budget.used == 0
