"""PD failure handling with real processes: a decode leg that cannot start frees the
prefill worker's KV at once (sequential and parallel), and the error comes back at once."""

from __future__ import annotations

import time
from pathlib import Path

import openai
import pytest

from .processes import start_all
from .wire_helpers import stats

MODEL = "tiny-qwen3-vl"


@pytest.fixture(scope="module")
def dead_decode(model_cache: Path):
    """A prefill worker, a decode worker that is killed, and a gateway per dispatch mode.

    Health checks are slowed down so the gateway still believes in the dead decode worker:
    the requests really reach the point where the decode leg fails to start.
    """
    prefill, decode = start_all(
        [["worker", "--model", MODEL, "--role", role] for role in ("prefill", "decode")]
    )
    pd = ["--pd-disaggregation", "--prefill", prefill.address, "--decode", decode.address]
    slow_health = ["--health-check-interval-secs", "600", "--max-retries", "0"]
    gateways = start_all(
        [
            ["gateway", "--port", "0", *pd, *slow_health, "--pd-dispatch", mode]
            for mode in ("sequential", "parallel")
        ]
    )
    decode.stop(9)
    yield prefill, dict(zip(("sequential", "parallel"), gateways, strict=True))
    for proc in [*gateways, prefill]:
        proc.stop()


@pytest.mark.parametrize("mode", ["sequential", "parallel"])
async def test_decode_that_cannot_start_frees_prefill_kv(dead_decode, mode: str) -> None:
    prefill, gateways = dead_decode
    client = openai.OpenAI(base_url=f"{gateways[mode].address}/v1", api_key="x", max_retries=0)
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=4
        )
    assert time.monotonic() - started < 10  # at once, not after a KV wait or lease
    assert info.value.status_code == 503
    assert info.value.response.json()["error"]["code"] == "decode_worker_failed_to_start"
    after = await stats(prefill.address)
    assert after["kv_stored"] >= 1 or mode == "parallel"
    assert after["held_kv_blocks"] == 0  # released now, not at the 30 s lease
