"""Stored conversations outlive gateways: PostgreSQL shared by two, SQLite across a kill.

- PostgreSQL (a server of the tests' own, ``postgres_server``): a response created through
  gateway A is retrieved and continued through gateway B; A restarted continues B's turn.
- SQLite: a gateway killed with SIGKILL loses no response it answered, and a stream it was
  in the middle of is not stored at all: its id reads as absent, and no later turn can
  continue from it (docs/operations.md, "What a response stores, and when").
- ``tandem serve`` stopped and started again keeps its conversations (the default SQLite
  file under ``$TANDEM_HISTORY_DIR``, which the test session points at a temp dir).
"""

from __future__ import annotations

import base64
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from .image_server import png_bytes
from .processes import Proc, start, start_all

pytestmark = pytest.mark.slow

MODEL = "tiny-qwen3-vl"
SERVE_READY = re.compile(r"TANDEM_SERVE_READY (\S+)")


@pytest.fixture(scope="module")
def worker(model_cache: Path) -> Iterator[Proc]:
    [proc] = start_all([["worker", "--model", MODEL, "--role", "both"]])
    yield proc
    proc.stop()


def gateway(worker: Proc, *store: str) -> Proc:
    [proc] = start_all([["gateway", "--port", "0", "--worker-urls", worker.address, *store]])
    return proc


def client(address: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{address}/v1", api_key="x", max_retries=0)


def image_turn(seed: int) -> list[dict[str, Any]]:
    url = "data:image/png;base64," + base64.b64encode(png_bytes(seed)).decode()
    parts = [
        {"type": "input_text", "text": "Describe it."},
        {"type": "input_image", "image_url": url},
    ]
    return [{"role": "user", "content": parts}]


def create(address: str, **fields: Any) -> Any:
    return client(address).responses.create(
        model=MODEL, max_output_tokens=12, temperature=0, **fields
    )


def test_two_gateways_share_postgres_and_a_restart_loses_nothing(worker, postgres_server) -> None:
    url = postgres_server.new_database()
    store = ["--history-backend", "postgres", "--postgres-db-url", url]
    a, b = gateway(worker, *store), gateway(worker, *store)
    try:
        first = create(a.address, input=image_turn(41))
        assert client(b.address).responses.retrieve(first.id).output_text == first.output_text
        second = create(b.address, input="And then?", previous_response_id=first.id)
        # B sent A's turn again, image included: the same as one gateway doing both turns.
        alone = create(a.address, input=image_turn(41))
        alone_second = create(a.address, input="And then?", previous_response_id=alone.id)
        assert second.output_text == alone_second.output_text
        assert second.usage.input_tokens == alone_second.usage.input_tokens
        a.stop()
        a = gateway(worker, *store)
        assert client(a.address).responses.retrieve(second.id).output_text == second.output_text
        third = create(a.address, input="Last one.", previous_response_id=second.id)
        assert third.status in ("completed", "incomplete")
        assert [i.id for i in client(b.address).responses.input_items.list(third.id).data]
    finally:
        a.stop()
        b.stop()


def test_a_killed_gateway_keeps_what_it_answered_and_nothing_half_done(
    worker, tmp_path: Path
) -> None:
    store = ["--history-backend", "sqlite", "--history-sqlite-path", str(tmp_path / "r.db")]
    gw = gateway(worker, *store)
    try:
        answered = create(gw.address, input=image_turn(42))
        stream = client(gw.address).responses.create(
            model=MODEL,
            input="Go on for a long while.",
            previous_response_id=answered.id,
            max_output_tokens=4000,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        cut_id = None
        for event in stream:
            if event.type == "response.created":
                cut_id = event.response.id
            if event.type == "response.output_text.delta":
                break
        assert cut_id is not None
        gw.stop(signal.SIGKILL)
        gw = gateway(worker, *store)
        api = client(gw.address)
        assert api.responses.retrieve(answered.id).output_text == answered.output_text
        with pytest.raises(openai.NotFoundError):
            api.responses.retrieve(cut_id)
        with pytest.raises(openai.NotFoundError):
            create(gw.address, input="x", previous_response_id=cut_id)
    finally:
        gw.stop()


def serve() -> tuple[Proc, str]:
    proc, _ = start(["serve", "--port", "0"])
    deadline = time.monotonic() + 120
    while not (found := SERVE_READY.search(proc.output())):
        if proc.popen.poll() is not None or time.monotonic() > deadline:
            proc.stop(signal.SIGKILL)
            pytest.fail(f"tandem serve did not become ready:\n{proc.output()[-4000:]}")
        time.sleep(0.2)
    return proc, found.group(1).removesuffix("/v1")


def test_tandem_serve_restarted_keeps_its_conversations(model_cache: Path) -> None:
    proc, address = serve()
    try:
        first = create(address, input=image_turn(43))
    finally:
        assert proc.stop(signal.SIGINT, timeout=20) == 0
    proc, address = serve()
    try:
        assert client(address).responses.retrieve(first.id).output_text == first.output_text
        second = create(address, input="More.", previous_response_id=first.id)
        assert second.previous_response_id == first.id
    finally:
        proc.stop(signal.SIGINT, timeout=20)
