"""KV is freed at once when a PD request is abandoned between its legs.

- A client that hangs up while the decode leg is still pulling its KV: the prefill
  worker's KV is released at once, not when its 30 s lease ends.
- A decode worker removed (``DELETE /workers``) while the prefill leg runs: a coded 503,
  never a 500, and the prefill's KV released at once.

Real processes; SIGSTOP holds a worker at an exact step (its socket still accepts the
gateway's bytes, it just does not answer yet).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest

from .processes import SINGLE_PROCESS, Proc, start_all
from .wire_helpers import stats

MODEL = "tiny-qwen3-vl"
# Far below the prefill worker's 30 s KV lease: "at once" cannot be the lease expiring.
PROMPTLY_S = 8.0


@pytest.fixture
def pd(model_cache: Path):
    prefill, decode = start_all(
        [["worker", "--model", MODEL, "--role", role] for role in ("prefill", "decode")]
    )
    # single_process: test_decode_worker_removed_between_the_legs removes a worker through
    # the admin API, which a gateway of several processes refuses (409).
    (gateway,) = start_all(
        [
            [
                "gateway",
                "--port",
                "0",
                "--pd-disaggregation",
                "--prefill",
                prefill.address,
                "--decode",
                decode.address,
                "--health-check-interval-secs",
                "600",
                "--max-retries",
                "0",
                *SINGLE_PROCESS,
            ]
        ]
    )
    yield prefill, decode, gateway
    for proc in (gateway, prefill, decode):
        if proc.popen.poll() is None:
            os.kill(proc.popen.pid, signal.SIGCONT)  # a failed test may leave one stopped
        proc.stop()


async def until(condition: Callable[[], Awaitable[bool]], timeout: float, what: str) -> float:
    """Poll ``condition``; the seconds it took, or fail naming ``what``."""
    started = time.monotonic()
    while not await condition():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"{what}: not within {timeout} s")
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def prefills_drained(gateway: Proc) -> float:
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"{gateway.address}/metrics")).text
    match = re.search(r"^tandem_pd_prefill_duration_seconds_count (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def body(stream: bool) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "max_tokens": 64,
        "temperature": 0,
        "stream": stream,
    }


async def test_client_leaving_during_the_kv_pull_frees_prefill_kv_at_once(pd) -> None:
    prefill, decode, gateway = pd
    os.kill(decode.popen.pid, signal.SIGSTOP)  # the decode leg will wait at its KV pull
    drained_before = await prefills_drained(gateway)
    async with httpx.AsyncClient(timeout=60) as http:
        request = asyncio.ensure_future(
            http.post(f"{gateway.address}/v1/chat/completions", json=body(stream=True))
        )
        # The prefill leg ran and the decode leg went out (it never answers: stopped).
        await until(
            lambda: _greater(prefills_drained(gateway), drained_before), 30, "prefill drained"
        )
        assert (await stats(prefill.address))["held_kv_blocks"] > 0
        request.cancel()  # the client hangs up
        with pytest.raises(asyncio.CancelledError):
            await request
    await until(lambda: _held_none(prefill), PROMPTLY_S, "prefill KV released")
    os.kill(decode.popen.pid, signal.SIGCONT)
    # The abandoned decode leg ends on its own; the decode worker is fine afterwards.
    await until(lambda: _idle(decode), 30, "decode worker idle")
    async with httpx.AsyncClient(timeout=60) as http:
        answer = await http.post(f"{gateway.address}/v1/chat/completions", json=body(False))
    assert answer.status_code == 200
    assert (await stats(prefill.address))["held_kv_blocks"] == 0


async def test_decode_worker_removed_between_the_legs(pd) -> None:
    prefill, decode, gateway = pd
    os.kill(prefill.popen.pid, signal.SIGSTOP)  # the prefill leg waits in its socket
    async with httpx.AsyncClient(timeout=60) as http:
        request = asyncio.ensure_future(
            http.post(f"{gateway.address}/v1/chat/completions", json=body(stream=False))
        )
        await until(lambda: _in_flight(gateway, prefill.address), 30, "prefill leg sent")
        removed = await http.delete(f"{gateway.address}/workers", params={"url": decode.address})
        assert removed.status_code == 200
        os.kill(prefill.popen.pid, signal.SIGCONT)
        answer = await asyncio.wait_for(request, 30)
    assert answer.status_code == 503
    error = answer.json()["error"]
    assert error["code"] == "decode_worker_failed_to_start"
    assert "removed" in error["message"]
    assert (await stats(prefill.address))["kv_stored"] >= 1  # the prefill leg did run
    await until(lambda: _held_none(prefill), PROMPTLY_S, "prefill KV released")


async def _greater(value: Awaitable[float], than: float) -> bool:
    return await value > than


async def _held_none(worker: Proc) -> bool:
    return (await stats(worker.address))["held_kv_blocks"] == 0


async def _idle(worker: Proc) -> bool:
    return (await stats(worker.address))["running"] == 0


async def _in_flight(gateway: Proc, url: str) -> bool:
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"{gateway.address}/metrics")).text
    match = re.search(rf'^tandem_worker_in_flight{{worker="{re.escape(url)}"}} (\S+)$', text, re.M)
    return bool(match and float(match.group(1)) >= 1)
