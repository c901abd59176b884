"""Admission control and graceful drain on a real gateway in front of a real worker.

A worker stopped with SIGSTOP holds every request at "waiting for the first frame", which
makes "a request is in flight" a state the test controls instead of a race it hopes for.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import signal
from pathlib import Path

import httpx
import pytest

from tandem.media import MediaPolicy
from tandem.models.image_batch import decode_cost
from tandem.models.processor import load_processor

from .gateway_probe import chat, eventually, metric, paused, sse_payloads, stays
from .image_server import png_bytes
from .processes import SINGLE_PROCESS, Proc, start_all

MODEL = "tiny-qwen3-vl"
# Health checks would mark a stopped worker unhealthy; these tests stop it on purpose.
# Router-side media: the pixel budget counts the tensors the gateway itself holds.
COMMON = ["--health-check-interval-secs", "600", "--mm-processing", "router"]


def image_chat(size: tuple[int, int] = (64, 48), seed: int = 0) -> dict:
    url = "data:image/png;base64," + base64.b64encode(png_bytes(seed, size)).decode()
    parts = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "What?"}]
    return {"model": MODEL, "messages": [{"role": "user", "content": parts}], "max_tokens": 4}


def gateway_args(worker: Proc, *extra: str) -> list[str]:
    return ["gateway", "--port", "0", "--worker-urls", worker.address, *COMMON, *extra]


@pytest.fixture(scope="module")
def worker(model_cache: Path):
    (proc,) = start_all([["worker", "--model", MODEL]])
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def queue_gateway(worker: Proc):
    # single_process: one slot and one queue place in all cannot be split over processes
    limits = ["--max-concurrent-requests", "1", "--max-queued-requests", "1"]
    (proc,) = start_all([gateway_args(worker, *SINGLE_PROCESS, *limits)])
    yield proc
    proc.stop()


async def test_a_full_queue_answers_429_with_retry_after(worker: Proc, queue_gateway: Proc):
    url = f"{queue_gateway.address}/v1/chat/completions"
    body = chat(MODEL, max_tokens=4)
    async with httpx.AsyncClient(timeout=60) as http:
        with paused(worker):
            running = asyncio.ensure_future(http.post(url, json=body))
            await eventually(lambda: metric(queue_gateway, "tandem_requests_running"))
            queued = asyncio.ensure_future(http.post(url, json=body))
            await eventually(lambda: metric(queue_gateway, "tandem_requests_queued"))
            refused = await http.post(url, json=body)
            assert refused.status_code == 429, refused.text
            assert refused.headers["retry-after"] == "1"
            assert refused.json()["error"]["code"] == "too_many_requests"
        answers = await asyncio.wait_for(asyncio.gather(running, queued), 60)
    assert [a.status_code for a in answers] == [200, 200]
    assert await metric(queue_gateway, "tandem_requests_running") == 0
    assert await metric(queue_gateway, "tandem_admission_rejected_total", reason="queue_full") >= 1


async def test_a_client_that_hangs_up_mid_stream_gives_its_slot_back(queue_gateway: Proc):
    url = f"{queue_gateway.address}/v1/chat/completions"
    body = chat(MODEL, stream=True, max_tokens=3000, ignore_eos=True)
    left = await metric(queue_gateway, "tandem_requests_total", code="client_disconnected")
    async with (
        httpx.AsyncClient(timeout=60) as http,
        http.stream("POST", url, json=body) as response,
    ):
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if '"content"' in line:
                break  # hang up while tokens are flowing
    assert await metric(queue_gateway, "tandem_requests_running") <= 1
    await eventually(lambda: _zero(metric(queue_gateway, "tandem_requests_running")))
    # Counted as the client leaving, not as a 200.
    gone = await metric(queue_gateway, "tandem_requests_total", code="client_disconnected")
    assert gone == left + 1
    async with httpx.AsyncClient(timeout=60) as http:
        answer = await http.post(url, json=chat(MODEL, max_tokens=2))
    assert answer.status_code == 200


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
async def test_a_client_that_hangs_up_before_the_first_token_gives_its_slot_back(
    worker: Proc, queue_gateway: Proc, stream: bool
):
    """The worker hangs (SIGSTOP) and the client gives up: nothing waits for the deadline."""
    url = f"{queue_gateway.address}/v1/chat/completions"
    before = queue_gateway.count("Exception in ASGI application")
    async with httpx.AsyncClient(timeout=60) as http:
        with paused(worker):
            waiting = asyncio.ensure_future(http.post(url, json=chat(MODEL, stream=stream)))
            await eventually(lambda: metric(queue_gateway, "tandem_requests_running"))
            waiting.cancel()  # the client closes its connection
            with contextlib.suppress(asyncio.CancelledError):
                await waiting
            # Long before --request-timeout-secs (300 s), with the worker still stopped.
            await eventually(lambda: _zero(metric(queue_gateway, "tandem_requests_running")))
    assert queue_gateway.count("Exception in ASGI application") == before
    assert await metric(queue_gateway, "tandem_requests_total", code="client_disconnected") >= 1
    async with httpx.AsyncClient(timeout=60) as http:
        answer = await http.post(url, json=chat(MODEL, max_tokens=2))
    assert answer.status_code == 200


async def test_a_stream_whose_first_token_never_comes_ends_at_the_request_timeout(worker: Proc):
    (gateway,) = start_all([gateway_args(worker, "--request-timeout-secs", "1")])
    url = f"{gateway.address}/v1/chat/completions"
    try:
        async with httpx.AsyncClient(timeout=60) as http:
            with paused(worker):
                started = asyncio.get_running_loop().time()
                answer = await http.post(url, json=chat(MODEL, stream=True))
                waited = asyncio.get_running_loop().time() - started
        assert answer.status_code == 504, answer.text
        assert answer.json()["error"]["code"] == "request_timeout"
        assert waited < 30  # bounded by the flag, not by the client's own 60 s
        assert await metric(gateway, "tandem_requests_running") == 0
    finally:
        gateway.stop()


async def _zero(value) -> bool:
    return await value == 0


async def test_the_pixel_budget_answers_429_then_413(worker: Proc, qwen_dir: Path):
    # One small image: while it is decoded it is charged its decode cost (from its header),
    # then only its pixel tensor. The budget has room for one request's pixel tensor and
    # less than one image being decoded (docs/operations.md, "Memory bounds for images").
    png = png_bytes(1, (64, 48))
    cost = decode_cost([png], MediaPolicy(), load_processor(qwen_dir), raw=True)
    assert 0 < cost.outputs < cost.total
    budget = cost.outputs + cost.total - 1
    # single_process: the budget is sized for one request in one process; split over
    # processes each share is below that request (multiprocess/shared_limits.py)
    budget_flag = ["--multimodal-max-inflight-bytes", str(budget)]
    (gateway,) = start_all([gateway_args(worker, *SINGLE_PROCESS, *budget_flag)])
    url = f"{gateway.address}/v1/chat/completions"
    try:
        async with httpx.AsyncClient(timeout=60) as http:
            with paused(worker):
                holding = asyncio.ensure_future(http.post(url, json=image_chat(seed=1)))
                await eventually(lambda: metric(gateway, "tandem_mm_inflight_bytes"))
                # Refused at once: a request let in would wait for the stopped worker.
                busy = await asyncio.wait_for(http.post(url, json=image_chat(seed=2)), 20)
                assert busy.status_code == 429, busy.text
                assert busy.headers["retry-after"] == "1"
                assert busy.json()["error"]["code"] == "multimodal_inflight_budget"
            assert (await asyncio.wait_for(holding, 60)).status_code == 200
            assert await metric(gateway, "tandem_mm_inflight_bytes") == 0
            too_big = await http.post(url, json=image_chat(size=(448, 448)))
            assert too_big.status_code == 413, too_big.text
            assert too_big.json()["error"]["code"] == "multimodal_payload_too_large"
            assert (await http.post(url, json=image_chat(seed=3))).status_code == 200
    finally:
        gateway.stop()


async def test_sigterm_drains_in_flight_streams_and_exits_0(worker: Proc):
    (gateway,) = start_all([gateway_args(worker, "--drain-timeout-secs", "30")])
    url = f"{gateway.address}/v1/chat/completions"
    body = chat(MODEL, stream=True, max_tokens=12, ignore_eos=True)
    lines: list[str] = []

    async def stream(http: httpx.AsyncClient) -> int:
        async with http.stream("POST", url, json=body) as response:
            async for line in response.aiter_lines():
                lines.append(line)
            return response.status_code

    try:
        async with httpx.AsyncClient(timeout=60) as http:
            with paused(worker):
                in_flight = asyncio.ensure_future(stream(http))
                await eventually(lambda: metric(gateway, "tandem_requests_running"))
                gateway.popen.send_signal(signal.SIGTERM)
                await eventually(lambda: gateway.count("draining in-flight requests"))
                # New work is refused: 503 while the socket is still open, then no socket.
                async with httpx.AsyncClient(timeout=10) as fresh:
                    try:
                        late = await fresh.post(url, json=chat(MODEL, max_tokens=2))
                    except httpx.TransportError:  # refused, or reset in the backlog
                        pass
                    else:
                        assert late.status_code == 503, late.text
                        assert late.json()["error"]["code"] == "shutting_down"
                # Still running is no event to wait for: a bounded half second, watched so that
                # an exit fails at once (a gateway that stopped without waiting for its
                # in-flight stream would be gone well within it).
                await stays(lambda: gateway.popen.poll() is None, seconds=0.5)
                assert gateway.popen.poll() is None  # still draining while the worker hangs
            assert await asyncio.wait_for(in_flight, 60) == 200
        payloads = sse_payloads(lines)
        assert payloads[-1] == "[DONE]"
        assert not [p for p in payloads if isinstance(p, dict) and "error" in p], payloads
        text = "".join(
            p["choices"][0]["delta"].get("content") or "" for p in payloads[:-1] if p.get("choices")
        )
        assert text
        assert await asyncio.to_thread(gateway.popen.wait, 30) == 0
    finally:
        gateway.stop(signal.SIGKILL)
