"""Video through the gateway, with the openai client: every media path, PD, refusals.

Clips are H.264 MP4s of the built-in picture world (``engine/builtin_clips.py``), sent as
``data:video/mp4`` URLs. Real workers, real gateways, real forward passes.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tandem.engine.builtin_clips import shape_clip
from tandem.engine.builtin_shapes import draw

from .image_server import ImageServer
from .processes import Proc, start_all
from .wire_helpers import stats

QWEN, LLAVA = "tiny-qwen3-vl", "tiny-llava-1.5"
# Same-length paths: the answer must not depend on where the video was processed.
PATHS = ("agg-router", "agg-worker", "pd-router", "pd-worker", "pd-parallel")


CLIP_DIR_FLAGS = ("--mm-allow-private-media-hosts", "--allowed-local-media-path")


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("clips")


@pytest.fixture(scope="module")
def clip_server() -> Iterator[ImageServer]:
    with ImageServer() as server:
        yield server


@pytest.fixture(scope="module")
def video(model_cache: Path, clip_dir: Path):
    local = [CLIP_DIR_FLAGS[0], CLIP_DIR_FLAGS[1], str(clip_dir)]
    roles = {
        "agg": [QWEN, "--role", "both", *local],
        "prefill": [QWEN, "--role", "prefill"],
        "decode": [QWEN, "--role", "decode"],
        "lmo": [QWEN, "--role", "decode", "--language-model-only"],
        "llava": [LLAVA, "--role", "both"],
    }
    workers = dict(
        zip(
            roles, start_all([["worker", "--model", *args] for args in roles.values()]), strict=True
        )
    )
    w = {name: proc.address for name, proc in workers.items()}
    pd = ["--pd-disaggregation", "--prefill", w["prefill"]]
    router, worker = ["--mm-processing", "router"], ["--mm-processing", "worker"]
    gateways = {
        "agg-router": [*router, "--worker-urls", w["agg"], *local],
        "agg-worker": [*worker, "--worker-urls", w["agg"], *local],
        "pd-router": [*router, *pd, "--decode", w["decode"]],
        "pd-worker": [*worker, *pd, "--decode", w["decode"]],
        "pd-parallel": [*router, *pd, "--decode", w["decode"], "--pd-dispatch", "parallel"],
        "pd-lmo": [*pd, "--decode", w["lmo"]],
        "llava": ["--worker-urls", w["llava"]],
        # Room for a clip's encoded bytes, not for its decoded frames.
        "budget": [*router, "--worker-urls", w["agg"], "--multimodal-max-inflight-bytes", "60000"],
        # 3 KiB per video (the clips are ~4 KB); 4 frames a second instead of 2.
        "small-videos": [*router, "--worker-urls", w["agg"], "--mm-max-video-mb", "0.003"],
        "fps4": [*router, "--worker-urls", w["agg"], "--mm-video-fps", "4"],
        "one-video": [*router, "--worker-urls", w["agg"], "--mm-per-request-video-limit", "1"],
    }
    specs = [["gateway", "--port", "0", *args] for args in gateways.values()]
    started = dict(zip(gateways, start_all(specs), strict=True))
    yield {**workers, **{f"gw:{k}": v for k, v in started.items()}}
    for proc in [*started.values(), *workers.values()]:
        proc.stop()


def clip_url(clip: bytes) -> str:
    return "data:video/mp4;base64," + base64.b64encode(clip).decode()


def picture_url(colour: str, shape: str) -> str:
    return (
        "data:image/png;base64," + base64.b64encode(draw(colour, shape, (128, 96)).png()).decode()
    )


def video_part(clip: bytes) -> dict:
    return {"type": "video_url", "video_url": {"url": clip_url(clip)}}


def ask(gateway: Proc, parts: list[dict], model: str = QWEN, text: str = "What is in this video?"):
    client = openai.OpenAI(base_url=f"{gateway.address}/v1", api_key="x", max_retries=0)
    return client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": [*parts, {"type": "text", "text": text}]}],
        max_tokens=12,
        temperature=0,
        logprobs=True,
    )


def tokens(reply) -> list[str]:
    return [entry.token for entry in reply.choices[0].logprobs.content]


def refusal(gateway: Proc, parts: list[dict], model: str = QWEN) -> tuple[int, dict]:
    with pytest.raises(openai.APIStatusError) as info:
        ask(gateway, parts, model)
    return info.value.status_code, info.value.response.json()["error"]


def test_video_is_token_identical_on_every_path(video) -> None:
    parts = [video_part(shape_clip("red", "circle"))]
    replies = {path: ask(video[f"gw:{path}"], parts) for path in PATHS}
    expected = replies["agg-router"]
    assert expected.choices[0].message.content
    for path, reply in replies.items():
        assert tokens(reply) == tokens(expected), path
        assert reply.usage.prompt_tokens == expected.usage.prompt_tokens, path


def test_videos_with_the_same_frame_count_get_different_answers(video) -> None:
    red, blue = shape_clip("red", "circle"), shape_clip("blue", "square")
    answers = []
    for clip in (red, blue, red):
        through_pd = ask(video["gw:pd-router"], [video_part(clip)])
        assert tokens(through_pd) == tokens(ask(video["gw:agg-router"], [video_part(clip)]))
        answers.append((through_pd.choices[0].message.content, through_pd.usage.prompt_tokens))
    assert answers[0][1] == answers[1][1], "same frame count and size: same prompt length"
    assert answers[0][0] != answers[1][0] and answers[0] == answers[2]


def test_the_same_video_twice_hits_the_prefix_cache(video) -> None:
    gateway = video["gw:agg-router"]
    clip = shape_clip("green", "triangle", frames=12, fps=4)
    first, second = ask(gateway, [video_part(clip)]), ask(gateway, [video_part(clip)])
    hit = second.usage.prompt_tokens_details.cached_tokens
    assert hit > first.usage.prompt_tokens_details.cached_tokens
    assert hit >= second.usage.prompt_tokens // 2, "the video's tokens come from the cache"
    # Another clip of the same size: nothing past the text before it may be reused.
    other = ask(gateway, [video_part(shape_clip("purple", "triangle", frames=12, fps=4))])
    assert (
        other.usage.prompt_tokens_details.cached_tokens
        <= first.usage.prompt_tokens_details.cached_tokens
    )
    assert tokens(second) == tokens(first)


@pytest.mark.parametrize("order", ["image-first", "video-first"])
def test_images_and_videos_mixed_in_order(video, order: str) -> None:
    image = {"type": "image_url", "image_url": {"url": picture_url("yellow", "square")}}
    clip = video_part(shape_clip("blue", "circle"))
    parts = [image, clip] if order == "image-first" else [clip, image]
    replies = {path: ask(video[f"gw:{path}"], parts, text="What do you see?") for path in PATHS}
    for path, reply in replies.items():
        assert tokens(reply) == tokens(replies["agg-router"]), path


async def test_worker_path_processes_the_video_once(video) -> None:
    prefill, decode = video["prefill"].address, video["decode"].address
    before = [(await stats(a))["media_items_processed"] for a in (prefill, decode)]
    ask(video["gw:pd-worker"], [video_part(shape_clip("orange", "circle"))])
    after = [(await stats(a))["media_items_processed"] for a in (prefill, decode)]
    assert [b - a for a, b in zip(before, after, strict=True)] == [1, 0]


def test_language_model_only_decode_is_refused_before_prefill(video) -> None:
    before = video["prefill"].count("Generate request")
    status, error = refusal(video["gw:pd-lmo"], [video_part(shape_clip("red", "circle"))])
    assert (status, error["code"]) == (400, "pd_decode_language_model_only_mrope")
    assert video["prefill"].count("Generate request") == before


def test_a_model_without_video_names_the_modality(video) -> None:
    status, error = refusal(video["gw:llava"], [video_part(shape_clip("red", "circle"))], LLAVA)
    assert (status, error["code"]) == (400, "multimodal_not_supported")
    assert "video" in error["message"]


def test_a_video_past_the_budget_is_refused(video) -> None:
    # 4 kB encoded; its 4 sampled frames and their patches take 295 kB, over the 60 kB.
    status, error = refusal(video["gw:budget"], [video_part(shape_clip("red", "circle"))])
    assert (status, error["code"]) == (413, "multimodal_payload_too_large")
    # A request the budget could hold goes through on the same gateway.
    assert ask(video["gw:budget"], [{"type": "text", "text": "hello"}]).choices[0].message


def test_video_errors_are_clear_400s(video) -> None:
    gateway = video["gw:agg-router"]
    status, error = refusal(
        gateway, [{"type": "video_url", "video_url": {"url": clip_url(b"nope")}}]
    )
    assert (status, error["code"]) == (400, "multimodal_processing_failed")
    status, error = refusal(gateway, [{"type": "video_url", "video_url": {"url": "ftp://x/y.mp4"}}])
    assert (status, error["code"]) == (400, "media_url_refused")


def test_tokenize_counts_the_video_tokens(video) -> None:
    gateway = video["gw:agg-router"]
    parts = [video_part(shape_clip("red", "circle"))]
    reply = ask(gateway, parts)
    body = {
        "model": QWEN,
        "messages": [
            {
                "role": "user",
                "content": [*parts, {"type": "text", "text": "What is in this video?"}],
            }
        ],
    }
    counted = httpx.post(f"{gateway.address}/tokenize", json=body, timeout=30).json()
    assert counted["count"] == reply.usage.prompt_tokens


@pytest.mark.parametrize("path", ["agg-router", "agg-worker"])
def test_http_and_file_urls_answer_as_the_data_url(
    video, clip_server: ImageServer, clip_dir: Path, path: str
) -> None:
    """The same clip as http(s) (loopback, allowed by flag), file:// under
    --allowed-local-media-path and data: URL: the same tokens, on both media paths."""
    clip = shape_clip("yellow", "square")
    (clip_dir / "yellow.mp4").write_bytes(clip)
    urls = [
        clip_url(clip),
        clip_server.serve("/yellow.mp4", clip, "video/mp4"),
        (clip_dir / "yellow.mp4").as_uri(),
    ]
    replies = [
        ask(video[f"gw:{path}"], [{"type": "video_url", "video_url": {"url": u}}]) for u in urls
    ]
    assert [tokens(r) for r in replies] == [tokens(replies[0])] * 3


def test_video_flags_are_applied(video) -> None:
    clip = shape_clip("red", "circle", frames=16, fps=4)  # 4 s: 8 frames at 2 fps, 16 at 4
    status, error = refusal(video["gw:small-videos"], [video_part(clip)])
    assert (status, error["code"]) == (400, "media_too_large")
    default = ask(video["gw:agg-router"], [video_part(clip)]).usage.prompt_tokens
    denser = ask(video["gw:fps4"], [video_part(clip)]).usage.prompt_tokens
    assert denser > default  # twice the temporal patches
    two = [video_part(clip), video_part(shape_clip("blue", "circle"))]
    status, error = refusal(video["gw:one-video"], two)
    assert (status, error["code"]) == (400, "multimodal_too_many_items")
    assert ask(video["gw:agg-router"], two).choices[0].message.content
