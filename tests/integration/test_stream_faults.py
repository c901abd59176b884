"""Failures on the way, each a coded error in Tandem's words (issue 38, item 2).

Null-engine workers (canned tokens, paced by ``--null-token-delay-ms``; the real gRPC
protocol and KV handoff) behind parallel-PD gateways, so that each failure can be made
to happen at a known point:

- a stream that outlives ``--request-timeout-secs``: an SSE error event (504, no gRPC
  words) and [DONE]; the Responses API's own ``response.failed``; a non-streamed one 504;
- a KV pull that fails (the prefill's lease ran out while the decode worker hung): a
  coded 503 before anything is streamed; a prefill worker that hangs: a 504;
- a prefill worker dying under parallel PD: a coded 5xx, its decode leg dropped.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from .gateway_probe import chat, eventually, paused, sse_payloads
from .processes import Proc, start_all
from .wire_helpers import stats

MODEL = "tiny-qwen3-vl"
TIMEOUT_S = 4.0
LEASE_S = 0.3  # the prefill's KV waits this long for its pull
# Words of gRPC core that must never reach a client (issue 38).
GRPC_WORDS = ("deadline exceeded", "socket closed", "stream removed", "failed to connect")


def null_worker(role: str, *extra: str) -> list[str]:
    return ["worker", "--model", MODEL, "--engine", "null", "--role", role, *extra]


def pd_gateway(prefill: Proc, decode: Proc) -> list[str]:
    return [
        "gateway", "--port", "0", "--pd-disaggregation", "--prefill", prefill.address,
        "--decode", decode.address, "--pd-dispatch", "parallel",
        "--request-timeout-secs", str(TIMEOUT_S), "--max-retries", "0",
        "--health-check-interval-secs", "600",
    ]  # fmt: skip


def _slow_pair() -> Iterator[tuple[Proc, Proc, Proc]]:
    prefill, decode = start_all(
        [
            null_worker("prefill", "--kv-lease-secs", str(LEASE_S)),
            null_worker("decode", "--null-token-delay-ms", "50", "--kv-pull-wait-secs", "1"),
        ]
    )
    (gateway,) = start_all([pd_gateway(prefill, decode)])
    yield prefill, decode, gateway
    for proc in (gateway, decode, prefill):
        proc.stop(signal.SIGKILL)


@pytest.fixture(scope="module")
def slow_pair(model_cache: Path) -> Iterator[tuple[Proc, Proc, Proc]]:
    """Tokens every 50 ms: a long answer outlives the request's deadline. Shared: every
    test leaves both workers running (paused ones are resumed)."""
    yield from _slow_pair()


@pytest.fixture
def doomed_pair(model_cache: Path) -> Iterator[tuple[Proc, Proc, Proc]]:
    """A pair of its own, for the test that kills its prefill worker."""
    yield from _slow_pair()


def assert_ours(error: dict[str, Any]) -> None:
    message = error["message"].lower()
    assert not any(words in message for words in GRPC_WORDS), error


async def stream(gateway: Proc, path: str, body: dict[str, Any]) -> list[Any]:
    lines: list[str] = []
    async with (
        httpx.AsyncClient(timeout=30) as http,
        http.stream("POST", f"{gateway.address}{path}", json=body) as response,
    ):
        assert response.status_code == 200
        lines = [line async for line in response.aiter_lines()]
    return sse_payloads(lines)


async def test_a_stream_past_the_request_deadline_ends_with_a_coded_event(slow_pair) -> None:
    _, decode, gateway = slow_pair
    body = chat(MODEL, stream=True, max_tokens=1000, ignore_eos=True)
    payloads = await stream(gateway, "/v1/chat/completions", body)
    assert payloads[-1] == "[DONE]", payloads[-3:]
    error = payloads[-2]["error"]
    assert (error["code"], error["type"]) == ("decode_stream_error", "server_error"), error
    assert "--request-timeout-secs" in error["message"]
    assert_ours(error)
    tokens = [p for p in payloads[:-2] if p.get("choices") and p["choices"][0]["delta"]]
    assert 5 < len(tokens) < 1000
    await eventually(lambda: _idle(decode))  # the cut leg ended on its worker too


async def test_the_responses_route_reports_it_as_response_failed(slow_pair) -> None:
    _, decode, gateway = slow_pair
    body = {"model": MODEL, "input": "hello", "stream": True, "max_output_tokens": 1000}
    payloads = await stream(gateway, "/v1/responses", {**body, "store": False})
    events = [p for p in payloads if isinstance(p, dict)]
    assert events[-1]["type"] == "response.failed", events[-2:]
    error = events[-1]["response"]["error"]
    assert error["code"] == "decode_stream_error"
    assert_ours(error)
    await eventually(lambda: _idle(decode))


async def test_a_non_streamed_request_past_the_deadline_is_a_504(slow_pair) -> None:
    _, _, gateway = slow_pair
    async with httpx.AsyncClient(timeout=30) as http:
        response = await http.post(
            f"{gateway.address}/v1/chat/completions",
            json=chat(MODEL, max_tokens=1000, ignore_eos=True),
        )
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "request_timeout"


async def test_a_failed_kv_pull_is_a_coded_503(slow_pair) -> None:
    prefill, decode, gateway = slow_pair
    url = f"{gateway.address}/v1/chat/completions"
    async with httpx.AsyncClient(timeout=30) as http:
        # kv_stored counts every store since the worker started (earlier tests of this
        # module stored too): wait for this request's own store, not for any.
        before = await _kv_stored(prefill)
        with paused(decode):  # the prefill leg ends; its KV's lease runs out meanwhile
            answer = asyncio.ensure_future(http.post(url, json=chat(MODEL, max_tokens=4)))
            await eventually(lambda: _stored_since(prefill, before))
            await eventually(lambda: _no_held_kv(prefill), timeout=LEASE_S + 2)
        response = await asyncio.wait_for(answer, 30)
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert error["code"] == "decode_worker_failed_to_start", error
    assert "could not pull KV from the prefill worker" in error["message"]
    assert_ours(error)


async def test_a_hung_prefill_worker_is_a_504(slow_pair) -> None:
    prefill, _, gateway = slow_pair
    async with httpx.AsyncClient(timeout=30) as http:
        with paused(prefill):
            response = await http.post(
                f"{gateway.address}/v1/chat/completions", json=chat(MODEL, max_tokens=4)
            )
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "request_timeout"


async def test_a_prefill_worker_dying_under_parallel_pd_is_a_coded_error(doomed_pair) -> None:
    prefill, decode, gateway = doomed_pair
    async with httpx.AsyncClient(timeout=30) as http:
        with paused(prefill):
            answer = asyncio.ensure_future(
                http.post(f"{gateway.address}/v1/chat/completions", json=chat(MODEL, max_tokens=4))
            )
            await asyncio.sleep(0.3)  # both legs are out; the prefill one hangs
            prefill.popen.send_signal(signal.SIGKILL)
        response = await asyncio.wait_for(answer, 30)
    assert response.status_code in (502, 503), response.text
    error = response.json()["error"]
    assert error["code"] in ("prefill_worker_failed_to_start", "decode_worker_failed_to_start")
    assert_ours(error)
    await eventually(lambda: _idle(decode))  # its decode leg was dropped, not left waiting


async def _idle(worker: Proc) -> bool:
    return int((await stats(worker.address))["running"]) == 0


async def _kv_stored(worker: Proc) -> int:
    return int((await stats(worker.address))["kv_stored"])


async def _stored_since(worker: Proc, before: int) -> bool:
    return await _kv_stored(worker) > before


async def _no_held_kv(worker: Proc) -> bool:
    return int((await stats(worker.address))["held_kv_blocks"]) == 0
