"""One id follows a request: the client's ``x-request-id``, the gateway's access line, the
workers' "Generate request" lines. Real PD workers and gateways, the official openai client.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from .gateway_probe import eventually, metric
from .processes import Proc, start_all

MODEL = "tiny-qwen3-vl"
REQUEST_ID = re.compile(r"^tandem-[0-9a-f]{32}$")
MESSAGES = [{"role": "user", "content": "Say something"}]


@pytest.fixture(scope="module")
def stack(model_cache: Path) -> Iterator[dict[str, Proc]]:
    prefill, decode = start_all(
        [
            ["worker", "--model", MODEL, "--role", "prefill"],
            ["worker", "--model", MODEL, "--role", "decode"],
        ]
    )
    pd = ["--pd-disaggregation", "--prefill", prefill.address, "--decode", decode.address]
    logged, quiet = start_all(
        [["gateway", "--port", "0", *pd], ["gateway", "--port", "0", "--no-access-log", *pd]]
    )
    yield {"prefill": prefill, "decode": decode, "gateway": logged, "quiet": quiet}
    for proc in (logged, quiet, prefill, decode):
        proc.stop()


def client(proc: Proc) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{proc.address}/v1", api_key="unused", max_retries=0)


def access_line(gateway: Proc, request_id: str) -> str:
    """The gateway's access line for ``request_id`` (its log is read by a thread: wait)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        lines = [line for line in list(gateway.lines) if f"id={request_id}" in line]
        if lines:
            assert len(lines) == 1, lines
            return lines[0]
        time.sleep(0.05)
    raise AssertionError(f"no access line for {request_id}:\n{gateway.output()[-2000:]}")


def test_an_answer_carries_the_id_that_the_gateway_and_both_workers_logged(stack) -> None:
    raw = client(stack["gateway"]).chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, max_tokens=4
    )
    answer, request_id = raw.parse(), raw.headers["x-request-id"]
    assert REQUEST_ID.match(request_id), request_id
    line = access_line(stack["gateway"], request_id)
    usage = answer.usage
    assert f"chat 200 id={request_id} " in line
    assert f"tokens={usage.prompt_tokens}+{usage.completion_tokens} " in line
    assert "stream=no images=0" in line
    prefill, decode = stack["prefill"].address, stack["decode"].address
    assert line.endswith(f"workers=prefill={prefill},decode={decode}")
    for role in ("prefill", "decode"):
        # The worker's log is read by a thread too: on a busy machine its line can trail.
        deadline = time.monotonic() + 10
        while not stack[role].count(f"Generate request {request_id}"):
            assert time.monotonic() < deadline, role
            time.sleep(0.05)
        assert stack[role].count(f"Generate request {request_id}") == 1, role


def test_a_stream_is_logged_once_it_ends(stack) -> None:
    raw = client(stack["gateway"]).chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, max_tokens=5, stream=True
    )
    request_id = raw.headers["x-request-id"]
    chunks = list(raw.parse())
    assert chunks and REQUEST_ID.match(request_id)
    line = access_line(stack["gateway"], request_id)
    assert f"chat 200 id={request_id} " in line and "stream=yes" in line
    assert re.search(r" tokens=\d+\+5 ", line), line


def test_a_refused_request_has_an_id_and_a_line_with_its_code(stack) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client(stack["gateway"]).chat.completions.create(
            model="no-such-model", messages=MESSAGES, max_tokens=4
        )
    request_id = info.value.response.headers["x-request-id"]
    line = access_line(stack["gateway"], request_id)
    assert f"chat 404 model_not_found id={request_id} " in line
    assert line.endswith("workers=-")


def test_no_access_log_drops_the_line_but_keeps_the_header(stack) -> None:
    quiet = stack["quiet"]
    counted = asyncio.run(chat_requests(quiet))
    raw = client(quiet).chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, max_tokens=2
    )
    request_id = raw.headers["x-request-id"]
    assert REQUEST_ID.match(request_id)
    assert stack["decode"].count(f"Generate request {request_id}") == 1
    # The request counter moves in the same call that would write the access line
    # (RequestRecord.finish in gateway/access_log.py), so once it has counted this request
    # the line, had there been one, is in the quiet gateway's output pipe.
    asyncio.run(eventually(lambda: _counted_beyond(quiet, counted)))
    # An absent line has no event to wait for: a short bounded wait leaves the test's
    # reader thread (processes._pump) time to move what is in the pipe into quiet.lines.
    time.sleep(0.2)
    assert not [line for line in list(quiet.lines) if "tandem.gateway.access" in line]


async def chat_requests(gateway: Proc) -> float:
    """The chat requests ``gateway`` has finished (counted whether logged or not)."""
    return await metric(gateway, "tandem_requests_total", route="chat")


async def _counted_beyond(gateway: Proc, count: float) -> bool:
    return await chat_requests(gateway) > count
