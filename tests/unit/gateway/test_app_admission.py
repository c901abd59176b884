"""Admission control through the real HTTP app: 429 with Retry-After, 413, 503 when
draining, and every slot and pixel byte given back however a request ends."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

from gateway_app_fakes import chat_body, client, image_url, make_gateway, wait_until

from tandem.errors import make_error
from tandem.models.image_batch import decode_cost

CHAT = "/v1/chat/completions"


async def test_queue_full_is_429_with_retry_after(qwen_meta_dir: Path) -> None:
    state, dispatcher = make_gateway(
        qwen_meta_dir, max_concurrent_requests=1, max_queued_requests=1
    )
    dispatcher.gate = asyncio.Event()
    async with client(state) as http:
        first = asyncio.ensure_future(http.post(CHAT, json=chat_body()))
        await wait_until(lambda: dispatcher.arrived == 1)
        queued = asyncio.ensure_future(http.post(CHAT, json=chat_body()))
        await wait_until(lambda: state.admission.queued == 1)
        refused = await http.post(CHAT, json=chat_body())
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "too_many_requests"
        assert refused.json()["error"]["type"] == "rate_limit_error"
        dispatcher.gate.set()
        answers = await asyncio.wait_for(asyncio.gather(first, queued), 10)
    assert [a.status_code for a in answers] == [200, 200]
    assert state.admission.running == 0 and state.admission.queued == 0


async def test_streams_hold_their_slot_until_the_end(qwen_meta_dir: Path) -> None:
    state, _ = make_gateway(qwen_meta_dir, max_concurrent_requests=1, max_queued_requests=0)
    async with client(state) as http:
        answer = await http.post(CHAT, json=chat_body(stream=True))
        assert answer.status_code == 200
        assert answer.text.rstrip().endswith("data: [DONE]")
        assert state.admission.running == 0
        # The slot came back: the next request gets in.
        assert (await http.post(CHAT, json=chat_body(stream=True))).status_code == 200


async def test_pixel_budget_429_then_413(qwen_meta_dir: Path) -> None:
    # Every request sends the same image: the pixel cache is off, or later requests would
    # hit it and be charged no decoding at all (that case: test_mm_pixel_cache.py).
    state, dispatcher = make_gateway(qwen_meta_dir, mm_max_inflight_bytes=0, mm_pixel_cache_mb=0)
    async with client(state) as http:
        assert (await http.post(CHAT, json=chat_body(images=1))).status_code == 200
        (one_image,) = dispatcher.pixel_bytes
        assert one_image > 0 and state.pixel_budget.used == 0
        # While decoded, an image is charged its decode cost (from its header); once
        # preprocessed, only its pixel tensor. Room for one image being decoded, or for
        # one request's pixels, not both.
        assert state.model is not None and state.model.processor is not None
        png = base64.b64decode(image_url(1).partition(",")[2])
        cost = decode_cost([png], state.config.media, state.model.processor, raw=True)
        assert cost.outputs == one_image and cost.total > one_image
        state.pixel_budget.limit = one_image + cost.total - 1
        dispatcher.gate = asyncio.Event()
        holding = asyncio.ensure_future(http.post(CHAT, json=chat_body(images=1)))
        await wait_until(lambda: dispatcher.arrived == 2)
        assert state.pixel_budget.used == one_image
        # Refused at once: a request let in would wait at the gate.
        busy = await asyncio.wait_for(http.post(CHAT, json=chat_body(images=1)), 10)
        assert busy.status_code == 429 and busy.headers["retry-after"] == "1"
        assert busy.json()["error"]["code"] == "multimodal_inflight_budget"
        # Text requests hold no pixels: admitted while the budget is full.
        text = asyncio.ensure_future(http.post(CHAT, json=chat_body()))
        await wait_until(lambda: dispatcher.arrived == 3)
        dispatcher.gate.set()
        answers = await asyncio.wait_for(asyncio.gather(holding, text), 10)
        assert [a.status_code for a in answers] == [200, 200]
        assert state.pixel_budget.used == 0
        # Two images (their pixels, and one decoded at a time) can never fit, even idle.
        too_big = await http.post(CHAT, json=chat_body(images=2))
        assert too_big.status_code == 413 and "retry-after" not in too_big.headers
        assert too_big.json()["error"]["code"] == "multimodal_payload_too_large"
        assert state.pixel_budget.used == 0 and state.admission.running == 0


async def test_failed_requests_give_everything_back(qwen_meta_dir: Path) -> None:
    state, dispatcher = make_gateway(qwen_meta_dir, max_concurrent_requests=1)
    dispatcher.fail = make_error("no_available_workers", "none")
    async with client(state) as http:
        for stream in (False, True):
            answer = await http.post(CHAT, json=chat_body(images=1, stream=stream))
            assert answer.status_code == 503
            assert state.admission.running == 0 and state.pixel_budget.used == 0
        bad = await http.post(CHAT, content=b"{not json")
        assert bad.status_code == 400 and state.admission.running == 0


async def test_declared_oversized_body_is_413_before_queueing(qwen_meta_dir: Path) -> None:
    state, _ = make_gateway(qwen_meta_dir, max_payload_size=4096, max_concurrent_requests=1)
    held = await state.admission.acquire(5)  # the gateway is full
    async with client(state) as http:
        answer = await http.post(CHAT, content=b"x" * 5000)
    assert answer.status_code == 413 and state.admission.queued == 0
    held.release()


async def test_draining_refuses_new_work_with_503(qwen_meta_dir: Path) -> None:
    state, dispatcher = make_gateway(qwen_meta_dir)
    state.draining = True
    async with client(state) as http:
        answer = await http.post(CHAT, json=chat_body())
        health = await http.get("/health")
    assert answer.status_code == 503 and answer.headers["retry-after"] == "1"
    assert answer.json()["error"]["code"] == "shutting_down"
    assert health.status_code == 503
    assert dispatcher.arrived == 0


async def test_a_malformed_image_header_is_a_clean_400(qwen_meta_dir: Path) -> None:
    state, dispatcher = make_gateway(qwen_meta_dir)
    cut = base64.b64encode(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00").decode()
    body = chat_body(images=1)
    bad = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + cut}}
    body["messages"][0]["content"].insert(1, bad)  # after a good image
    async with client(state) as http:
        answer = await http.post(CHAT, json=body)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["code"] == "multimodal_processing_failed"
    assert "image header is corrupt" in answer.json()["error"]["message"]
    assert dispatcher.arrived == 0
    assert state.pixel_budget.used == 0 and state.admission.running == 0
