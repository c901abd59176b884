"""The null engine (``tandem worker --engine null``) behind a real gateway, text and images.

It answers canned tokens at once but keeps the protocol and the PD handoff: a PD request
goes through a real KV pull, and the decode leg carries no pixel bytes.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import openai
import pytest

from .image_server import image_messages
from .processes import Proc, start_all
from .wire_helpers import stats

NULL = ["worker", "--engine", "null", "--mm-processor", "off"]


@pytest.fixture(scope="module")
def null_pd(model_cache: Path):
    prefill, decode = start_all([[*NULL, "--role", "prefill"], [*NULL, "--role", "decode"]])
    (gateway,) = start_all(
        [
            [
                "gateway",
                "--port",
                "0",
                "--mm-processing",
                "router",
                "--pd-disaggregation",
                "--prefill",
                prefill.address,
                "--decode",
                decode.address,
            ]
        ]
    )
    yield {"prefill": prefill, "decode": decode, "gateway": gateway}
    for proc in (gateway, prefill, decode):
        proc.stop()


def client(gateway: Proc) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.address}/v1", api_key="x", max_retries=0)


def test_text_and_image_through_null_pd(null_pd) -> None:
    c = client(null_pd["gateway"])
    text = c.chat.completions.create(
        model="tiny-qwen3-vl",
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=5,
    )
    assert text.choices[0].message.content == "null "
    assert text.choices[0].finish_reason == "length"
    assert text.usage.completion_tokens == 5
    chunks = c.chat.completions.create(
        model="tiny-qwen3-vl", messages=image_messages(1), max_tokens=7, stream=True
    )
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert streamed == "null en"

    prefill = asyncio.run(stats(null_pd["prefill"].address))
    decode = asyncio.run(stats(null_pd["decode"].address))
    assert prefill["kv_stored"] == 2 and prefill["held_transfers"] == 0  # both pulled
    legs_p, legs_d = prefill["leg_bytes"]["prefill"], decode["leg_bytes"]["decode"]
    assert legs_p["requests"] == 2 and legs_d["requests"] == 2
    assert legs_p["pixel_bytes"] > 0
    assert legs_d["pixel_bytes"] == 0
