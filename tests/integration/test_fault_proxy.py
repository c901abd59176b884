"""The network between gateway and worker breaking, through a TCP proxy (issue 38, item 3).

A null-engine worker (real gRPC, canned tokens every 20 ms) is reached only through a
loopback proxy (``tcp_proxy.py``) that resets or stalls the connection mid-stream. The
client gets a coded error event in Tandem's words and [DONE], never gRPC's text; the
worker stops the cut request; and the gateway serves again once the network does.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tandem.hostport import split_host_port

from .gateway_probe import chat, eventually, sse_payloads
from .processes import Proc, start_all
from .tcp_proxy import TcpProxy
from .wire_helpers import stats

MODEL = "tiny-qwen3-vl"
TIMEOUT_S = 3.0
GRPC_WORDS = ("deadline exceeded", "socket closed", "stream removed", "connection reset")


@pytest.fixture
async def behind_proxy(model_cache: Path) -> AsyncIterator[tuple[Proc, TcpProxy, Proc]]:
    (worker,) = start_all(
        [["worker", "--model", MODEL, "--engine", "null", "--null-token-delay-ms", "20"]]
    )
    proxy = TcpProxy(*split_host_port(worker.address))
    address = await proxy.start()
    # In a thread: the proxy serves on this loop while the gateway starts (it dials the
    # worker through it).
    (gateway,) = await asyncio.to_thread(
        start_all,
        [
            [
                "gateway", "--port", "0", "--worker-urls", address,
                "--request-timeout-secs", str(TIMEOUT_S), "--max-retries", "0",
                "--health-check-interval-secs", "600",
            ]
        ],
    )  # fmt: skip
    try:
        yield worker, proxy, gateway
    finally:
        await proxy.stop()
        for proc in (gateway, worker):
            proc.stop(signal.SIGKILL)


async def read_stream(gateway: Proc, on_tokens: Any) -> list[Any]:
    """Stream a long answer; ``on_tokens()`` runs once, when tokens are flowing."""
    body = chat(MODEL, stream=True, max_tokens=500, ignore_eos=True)
    lines: list[str] = []
    fired = False
    async with (
        httpx.AsyncClient(timeout=30) as http,
        http.stream("POST", f"{gateway.address}/v1/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        async for line in response.aiter_lines():
            lines.append(line)
            if '"content"' in line and not fired:
                fired = True
                on_tokens()
    return sse_payloads(lines)


def error_event(payloads: list[Any]) -> dict[str, Any]:
    assert payloads[-1] == "[DONE]", payloads[-3:]
    error = payloads[-2]["error"]
    assert error["type"] == "server_error", error
    assert not any(words in error["message"].lower() for words in GRPC_WORDS), error
    tokens = [p for p in payloads[:-2] if p.get("choices") and p["choices"][0]["delta"]]
    assert 0 < len(tokens) < 500
    return error


async def ok(gateway: Proc) -> bool:
    async with httpx.AsyncClient(timeout=30) as http:
        url = f"{gateway.address}/v1/chat/completions"
        return (await http.post(url, json=chat(MODEL, max_tokens=3))).status_code == 200


async def idle(worker: Proc) -> bool:
    return int((await stats(worker.address))["running"]) == 0


async def test_a_reset_mid_stream_is_a_coded_event_and_the_next_request_is_served(
    behind_proxy,
) -> None:
    worker, proxy, gateway = behind_proxy
    assert proxy.connections >= 1  # the gateway reaches the worker through the proxy only
    error = error_event(await read_stream(gateway, proxy.reset))
    assert error["message"].startswith("the connection to the worker was lost"), error
    await eventually(lambda: idle(worker))  # the worker saw the call end and stopped it
    assert await eventually(lambda: ok(gateway), timeout=10)  # a new connection, same proxy


async def test_a_stalled_network_mid_stream_ends_at_the_deadline(behind_proxy) -> None:
    worker, proxy, gateway = behind_proxy
    error = error_event(await read_stream(gateway, proxy.stall))
    assert "--request-timeout-secs" in error["message"], error
    proxy.resume()
    await eventually(lambda: idle(worker))
    assert await eventually(lambda: ok(gateway), timeout=10)


async def test_a_stalled_network_before_the_first_token_is_a_504(behind_proxy) -> None:
    _, proxy, gateway = behind_proxy
    proxy.stall()
    async with httpx.AsyncClient(timeout=30) as http:
        response = await http.post(
            f"{gateway.address}/v1/chat/completions", json=chat(MODEL, max_tokens=3)
        )
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "request_timeout"
    proxy.resume()
    assert await eventually(lambda: ok(gateway), timeout=10)
