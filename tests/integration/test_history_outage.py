"""The history database going away mid-run (issue 38, item 3): PostgreSQL stopped as a crash
would stop it, under a gateway storing Responses API conversations.

While it is down, a request that must store or read a conversation is a coded 503
(``history_unavailable``) in bounded time, never a hang or a stack trace; one that stores
nothing is served as usual. Once it is back, the gateway uses it again with no restart, and
what was stored before the outage is still there.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from .processes import Proc, start_all

MODEL = "tiny-qwen3-vl"
BOUND_S = 15.0  # an answer, even an error, comes within this while the database is down


@pytest.fixture
def stack(model_cache: Path, postgres_server) -> Iterator[tuple[Proc, openai.OpenAI]]:
    url = postgres_server.new_database()
    (worker,) = start_all([["worker", "--model", MODEL, "--engine", "null"]])
    (gateway,) = start_all(
        [
            [
                "gateway", "--port", "0", "--worker-urls", worker.address,
                "--history-backend", "postgres", "--postgres-db-url", url,
            ]
        ]
    )  # fmt: skip
    client = openai.OpenAI(base_url=f"{gateway.address}/v1", api_key="x", max_retries=0)
    try:
        yield gateway, client
    finally:
        client.close()
        for proc in (gateway, worker):
            proc.stop(signal.SIGKILL)


def create(client: openai.OpenAI, **fields: object) -> str:
    return client.responses.create(model=MODEL, input="hello", max_output_tokens=4, **fields).id


def refused_fast(call) -> dict:
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as info:
        call()
    assert time.monotonic() - started < BOUND_S
    assert info.value.status_code == 503, info.value.response.text
    return info.value.response.json()["error"]


def test_postgres_stopped_mid_run_is_a_coded_503_and_its_return_is_used(
    stack, postgres_server
) -> None:
    gateway, client = stack
    before = create(client)
    postgres_server.halt()
    try:
        error = refused_fast(lambda: create(client))
        assert error["code"] == "history_unavailable", error
        error = refused_fast(lambda: client.responses.retrieve(before))
        assert error["code"] == "history_unavailable", error
        assert create(client, store=False)  # nothing to store: served as usual
        assert gateway.popen.poll() is None
        assert gateway.count("Traceback") == 0
    finally:
        postgres_server.start_server()
    deadline = time.monotonic() + 30
    while True:  # the pool reconnects on its own: no gateway restart
        try:
            after = create(client, previous_response_id=before)
            break
        except openai.APIStatusError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    assert client.responses.retrieve(after).previous_response_id == before
