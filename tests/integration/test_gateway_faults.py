"""Worker faults under a PD gateway, with real processes killed by SIGKILL.

- a decode worker killed mid-stream: the client reads an SSE error event in Tandem's words,
  then [DONE];
- a decode worker killed before it pulled the KV: the prefill worker's KV is freed within
  its lease (here, at once: the gateway releases it);
- a prefill worker killed: requests retry on the other prefill worker; with none left, 503.

Health checks are slowed down so that the gateway still believes in a dead worker: the
requests really meet the failure instead of being routed around it in advance.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import httpx
import pytest

from tandem.hostport import split_host_port

from .gateway_probe import chat, eventually, metric, paused, sse_payloads
from .processes import Proc, start_all
from .wire_helpers import stats

MODEL = "tiny-qwen3-vl"
LEASE_S = 3.0
QUIET_HEALTH = ["--health-check-interval-secs", "600"]


def prefill_args() -> list[str]:
    return ["worker", "--model", MODEL, "--role", "prefill", "--kv-lease-secs", str(LEASE_S)]


def pd_gateway(prefills: list[Proc], decode: Proc, *extra: str) -> list[str]:
    return [
        "gateway",
        "--port",
        "0",
        "--pd-disaggregation",
        "--prefill",
        *[p.address for p in prefills],
        "--decode",
        decode.address,
        *QUIET_HEALTH,
        *extra,
    ]


@pytest.fixture
def one_pair(model_cache: Path):
    prefill, decode = start_all([prefill_args(), ["worker", "--model", MODEL, "--role", "decode"]])
    (gateway,) = start_all([pd_gateway([prefill], decode)])
    yield prefill, decode, gateway
    for proc in (gateway, decode, prefill):
        proc.stop(signal.SIGKILL)


async def held_kv(prefill: Proc) -> int:
    return int((await stats(prefill.address))["held_kv_blocks"])


async def test_decode_killed_mid_stream_ends_the_sse_cleanly(one_pair) -> None:
    prefill, decode, gateway = one_pair
    body = chat(MODEL, stream=True, max_tokens=3000, ignore_eos=True)
    lines: list[str] = []
    async with (
        httpx.AsyncClient(timeout=60) as http,
        http.stream("POST", f"{gateway.address}/v1/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        async for line in response.aiter_lines():
            lines.append(line)
            if '"content"' in line and decode.popen.poll() is None:
                decode.popen.send_signal(signal.SIGKILL)  # tokens are flowing: kill it now
    payloads = sse_payloads(lines)
    assert payloads[-1] == "[DONE]", payloads[-3:]
    error = payloads[-2]
    assert isinstance(error, dict) and error["error"]["code"] == "decode_stream_error", error
    assert error["error"]["type"] == "server_error"
    # In Tandem's words, not gRPC's ("Stream removed (Socket closed)"): issue 38.
    assert error["error"]["message"].startswith("the connection to the worker was lost"), error
    tokens = sum(1 for p in payloads[:-2] if p.get("choices") and p["choices"][0]["delta"])
    assert 0 < tokens < 3000
    # Nothing is left behind on the prefill worker once its lease has run out: polled, within
    # the lease and the half second the test always allowed past it.
    await eventually(lambda: _zero(held_kv(prefill)), timeout=LEASE_S + 0.5)
    assert await held_kv(prefill) == 0


async def test_decode_killed_before_its_pull_frees_the_prefill_kv(one_pair) -> None:
    prefill, decode, gateway = one_pair
    url = f"{gateway.address}/v1/chat/completions"
    async with httpx.AsyncClient(timeout=60) as http:
        with paused(decode):
            answer = asyncio.ensure_future(http.post(url, json=chat(MODEL, max_tokens=4)))
            # The prefill leg is done and its KV waits for a pull that will never come.
            await eventually(lambda: held_kv(prefill))
            decode.popen.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        response = await asyncio.wait_for(answer, 30)
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "decode_worker_failed_to_start"
    await eventually(lambda: _zero(held_kv(prefill)), timeout=LEASE_S + 2)
    assert time.monotonic() - killed_at < LEASE_S + 2


async def _zero(value) -> bool:
    return await value == 0


async def test_a_dead_prefill_worker_is_retried_elsewhere_then_503(model_cache: Path) -> None:
    first, second, decode = start_all(
        [prefill_args(), prefill_args(), ["worker", "--model", MODEL, "--role", "decode"]]
    )
    (gateway,) = start_all([pd_gateway([first, second], decode, "--prefill-policy", "round_robin")])
    url = f"{gateway.address}/v1/chat/completions"
    try:
        first.stop(signal.SIGKILL)
        async with httpx.AsyncClient(timeout=60) as http:
            for i in range(4):  # round robin: the dead worker is picked at least once
                body = chat(MODEL, f"hello {i}", max_tokens=4, stream=i % 2 == 1)
                response = await http.post(url, json=body)
                assert response.status_code == 200, response.text
                if body["stream"]:
                    assert sse_payloads(response.text.splitlines())[-1] == "[DONE]"
            assert await metric(gateway, "tandem_retries_total") >= 1
            second.stop(signal.SIGKILL)
            response = await http.post(url, json=chat(MODEL, max_tokens=4))
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] in {
            "prefill_worker_failed_to_start",
            "no_available_workers",
            "no_compatible_pd_pair",
        }
    finally:
        for proc in (gateway, decode, second, first):
            proc.stop(signal.SIGKILL)


async def described(gateway: Proc, worker_address: str) -> dict:
    async with httpx.AsyncClient(timeout=10) as http:
        listing = (await http.get(f"{gateway.address}/workers")).json()["workers"]
    return next(w for w in listing if w["url"] == worker_address)


async def test_a_hung_worker_times_out_leaves_the_pool_and_a_restart_brings_it_back(
    model_cache: Path,
) -> None:
    worker = ["worker", "--model", MODEL]
    hung, steady = start_all([worker, worker])
    (gateway,) = start_all(
        [
            [
                "gateway", "--port", "0", "--worker-urls", hung.address, steady.address,
                "--policy", "round_robin", "--request-timeout-secs", "2",
                "--health-check-interval-secs", "0.5", "--max-retries", "0",
            ]
        ]
    )  # fmt: skip
    url = f"{gateway.address}/v1/chat/completions"
    restarted: Proc | None = None

    async def ask(http: httpx.AsyncClient, i: int) -> int:
        return (await http.post(url, json=chat(MODEL, f"hi {i}", max_tokens=2))).status_code

    try:
        async with httpx.AsyncClient(timeout=30) as http:
            with paused(hung):
                # Round robin: one of two requests meets the hung worker and times out.
                assert sorted([await ask(http, 0), await ask(http, 1)]) == [200, 504]
                # The timed-out request no longer counts against the hung worker.
                assert (await described(gateway, hung.address))["in_flight"] == 0

                async def isolated() -> bool:
                    state = await described(gateway, hung.address)
                    return not state["healthy"] and state["circuit"] == "open"

                await eventually(isolated, timeout=40, every=0.5)
                assert [await ask(http, i) for i in range(3)] == [200, 200, 200]
            # A restart: a fresh process on the same address, found by the health checks.
            hung.stop(signal.SIGKILL)
            port = str(split_host_port(hung.address)[1])
            (restarted,) = start_all([[*worker, "--port", port]])

            async def back() -> bool:
                state = await described(gateway, hung.address)
                return state["healthy"] and state["circuit"] == "closed"

            await eventually(back, timeout=40, every=0.5)
            before = restarted.count("Generate request")
            assert [await ask(http, i) for i in range(4)] == [200] * 4
            assert restarted.count("Generate request") > before  # traffic is back on it
    finally:
        for proc in (gateway, steady, hung, restarted):
            if proc is not None:
                proc.stop(signal.SIGKILL)
