"""The router path's videos and the in-flight budget: charged from the container header
before any frame is decoded, holding only the patches once done."""

from __future__ import annotations

import base64
from collections.abc import Callable

import pytest
from mm_gateway_models import Model

from tandem.engine.builtin_clips import shape_clip
from tandem.errors import TandemError
from tandem.gateway.admission import PixelBudget
from tandem.gateway.multimodal import videos as videos_module
from tandem.gateway.multimodal.videos import process_videos
from tandem.media import MediaPolicy
from tandem.models.video import QwenVideoProcessor
from tandem.models.video_batch import plan_video


def _encoder(model: Model) -> Callable[[str], list[int]]:
    return lambda text: model.tokenizer.encode(text, add_special_tokens=False).ids


def _url(clip: bytes) -> str:
    return "data:video/mp4;base64," + base64.b64encode(clip).decode()


async def test_a_video_over_the_budget_is_refused_before_decoding(
    qwen: Model, monkeypatch: pytest.MonkeyPatch
) -> None:
    video = QwenVideoProcessor.from_model_dir(qwen.info.model_dir)
    clip = shape_clip("red", "circle")
    cost = plan_video(clip, MediaPolicy(), video).nbytes
    decoded: list[int] = []
    real = videos_module.decode_video
    monkeypatch.setattr(
        videos_module, "decode_video", lambda *a, **k: decoded.append(1) or real(*a, **k)
    )
    budget = PixelBudget(cost - 1)
    with pytest.raises(TandemError) as caught:
        await process_videos(
            [_url(clip)], qwen.info, video, MediaPolicy(), _encoder(qwen), lease=budget.lease()
        )
    assert (caught.value.status, caught.value.code) == (413, "multimodal_payload_too_large")
    assert decoded == [] and budget.used == 0


async def test_once_done_the_request_holds_its_patches_only(qwen: Model) -> None:
    video = QwenVideoProcessor.from_model_dir(qwen.info.model_dir)
    clips = [shape_clip("red", "circle"), shape_clip("blue", "square", frames=12)]
    budget = PixelBudget(1 << 30)
    lease = budget.lease()
    lease.hold(1000)  # what the request's images already hold
    done = await process_videos(
        [_url(c) for c in clips], qwen.info, video, MediaPolicy(), _encoder(qwen), lease=lease
    )
    assert lease.nbytes == 1000 + done.batch.pixel_values.nbytes == budget.used
    assert done.batch.grid.shape == (2, 3) and len(done.hashes) == 2
    assert done.hashes[0] != done.hashes[1]
    lease.release()
    assert budget.used == 0
