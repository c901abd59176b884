"""Faults of an E/P/D encode worker, and a connection dropped during the KV pull (issue 38,
item 3).

- The encode worker (TokenSpeed protocol, the real embedded engine and vision tower of
  tiny-qwen3-vl) is held with SIGSTOP while an image request's encode leg is out, then
  SIGKILLed (a coded 5xx at once) or kept held past the deadline (504); killed at the first
  streamed token, it is not missed (its features are already in the prefill's KV).
- A loopback TCP proxy stands in front of a null-engine prefill worker, so both the
  gateway's prefill leg and the decode worker's KV pull (it dials the prefill's registered
  address) cross it; with the pull open at the held prefill, every connection is reset.

Each case checks the client's outcome, no KV lease held and nothing running on the workers
afterwards, and no traceback in the gateway's log.
"""

from __future__ import annotations

import asyncio
import base64
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tandem.hostport import split_host_port

from .fault_outcome import assert_no_traceback, in_background, nothing_held, streamed
from .gateway_probe import chat, eventually
from .image_server import png_bytes
from .processes import Proc, start_all
from .tcp_proxy import TcpProxy

MODEL = "tiny-qwen3-vl"
DEADLINE_S = 6.0
HELD_S = 0.5
TS = ["--protocol", "tokenspeed"]


@pytest.fixture
def epd(model_cache: Path) -> Iterator[dict[str, Proc]]:
    encode, prefill, decode = start_all(
        [
            ["worker", "--model", MODEL, *TS, "--role", role]
            for role in ("encode", "prefill", "decode")
        ]
    )
    (gateway,) = start_all(
        [
            [
                "gateway", "--port", "0", "--epd-disaggregation", "--encode", encode.address,
                "--prefill", prefill.address, "--decode", decode.address,
                "--request-timeout-secs", str(DEADLINE_S), "--max-retries", "0",
                "--health-check-interval-secs", "600",
            ]
        ]
    )  # fmt: skip
    yield {"encode": encode, "prefill": prefill, "decode": decode, "gateway": gateway}
    for proc in (gateway, decode, prefill, encode):
        if proc.popen.poll() is None:
            proc.popen.send_signal(signal.SIGCONT)
        proc.stop(signal.SIGKILL)


def image_chat(max_tokens: int) -> dict:
    url = "data:image/png;base64," + base64.b64encode(png_bytes(7)).decode()
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "Hi"}]
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "stream": True,
        "max_tokens": max_tokens,
        "ignore_eos": True,
    }


@pytest.mark.parametrize(
    ("sig", "status", "code"),
    [(signal.SIGKILL, 503, "encode_worker_failed"), (signal.SIGSTOP, 504, "request_timeout")],
    ids=["SIGKILL", "SIGSTOP"],
)
async def test_an_encode_worker_fault_before_the_first_token(epd, sig, status, code) -> None:
    url = f"{epd['gateway'].address}/v1/chat/completions"
    encode = epd["encode"]
    encode.popen.send_signal(signal.SIGSTOP)
    answer = await in_background(streamed(url, image_chat(8)))
    await asyncio.sleep(HELD_S)  # the encode leg is out, at the held worker
    if sig == signal.SIGKILL:
        encode.popen.send_signal(signal.SIGKILL)
    outcome = await asyncio.wait_for(answer, 60)
    if encode.popen.poll() is None:
        encode.popen.send_signal(signal.SIGCONT)
    assert (outcome.status, outcome.code, outcome.tokens) == (status, code, 0), outcome
    await nothing_held([epd["prefill"], epd["decode"]], within=10)
    assert_no_traceback(epd["gateway"])


async def test_an_encode_worker_killed_mid_stream_is_not_missed(epd) -> None:
    url = f"{epd['gateway'].address}/v1/chat/completions"
    encode = epd["encode"]
    outcome = await streamed(url, image_chat(24), on_token=lambda: encode.popen.kill())
    assert outcome.answered and outcome.tokens > 0, outcome
    await nothing_held([epd["prefill"], epd["decode"]], within=10)
    assert_no_traceback(epd["gateway"])


@pytest.fixture
async def proxied_prefill(model_cache: Path) -> AsyncIterator[tuple[Proc, Proc, Proc, TcpProxy]]:
    prefill, decode = start_all(
        [
            ["worker", "--model", MODEL, "--engine", "null", "--role", "prefill",
             "--kv-lease-secs", "1"],
            ["worker", "--model", MODEL, "--engine", "null", "--role", "decode",
             "--null-token-delay-ms", "20", "--kv-pull-wait-secs", "2"],
        ]
    )  # fmt: skip
    proxy = TcpProxy(*split_host_port(prefill.address))
    address = await proxy.start()
    # In a thread: the proxy serves on this loop while the gateway dials through it.
    (gateway,) = await asyncio.to_thread(
        start_all,
        [
            [
                "gateway", "--port", "0", "--pd-disaggregation", "--prefill", address,
                "--decode", decode.address, "--pd-dispatch", "parallel",
                "--request-timeout-secs", str(DEADLINE_S), "--max-retries", "0",
                "--health-check-interval-secs", "600",
            ]
        ],
    )  # fmt: skip
    try:
        yield prefill, decode, gateway, proxy
    finally:
        await proxy.stop()
        for proc in (gateway, decode, prefill):
            if proc.popen.poll() is None:
                proc.popen.send_signal(signal.SIGCONT)
            proc.stop(signal.SIGKILL)


async def test_connections_reset_during_the_kv_pull(proxied_prefill) -> None:
    prefill, decode, gateway, proxy = proxied_prefill
    url = f"{gateway.address}/v1/chat/completions"
    prefill.popen.send_signal(signal.SIGSTOP)
    answer = await in_background(streamed(url, chat(MODEL, stream=True, max_tokens=8)))
    # Both legs are out: the gateway's prefill leg and the decode worker's pull.
    await eventually(lambda: proxy.connections >= 2)
    await asyncio.sleep(HELD_S)
    proxy.reset()
    prefill.popen.send_signal(signal.SIGCONT)
    outcome = await asyncio.wait_for(answer, 30)
    assert outcome.status in (502, 503) and outcome.code is not None, outcome
    assert outcome.code.endswith("_failed_to_start"), outcome
    await nothing_held([prefill, decode], within=5)
    # The gateway dials through the proxy again: the next request is served.
    again = await streamed(url, chat(MODEL, stream=True, max_tokens=8))
    assert again.answered, again
    await nothing_held([prefill, decode], within=5)
    assert_no_traceback(gateway)
