"""``/v1/responses`` over the real app in-process: framing, failures, and what is stored.

The worker side is scripted (``gateway_app_fakes``) so that a test decides when a stream
breaks; the prompt, media and respond stages and the memory history backend are real.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from gateway_app_fakes import MODEL, ScriptedDispatcher, client, make_gateway

from tandem.errors import make_error
from tandem.gateway import metrics
from tandem.gateway.history.store import HistoryError, StoredResponse
from tandem.wire.proto import pb


class BreaksMidStream(ScriptedDispatcher):
    """Sends one token, then fails as a decode worker dying mid-generation would."""

    async def _frames(self) -> AsyncIterator[pb.GenerateResponse]:
        yield pb.GenerateResponse(chunk=pb.GenerateStreamChunk(token_ids=self.tokens[:1]))
        raise make_error("decode_stream_error", "decode worker went away")


def events(text: str) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) per SSE block; fails on a block without both lines."""
    out = []
    for block in text.strip().split("\n\n"):
        name_line, data_line = block.split("\n")
        assert name_line.startswith("event: ") and data_line.startswith("data: "), block
        out.append((name_line[len("event: ") :], json.loads(data_line[len("data: ") :])))
    return out


def body(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "input": "What is this?", "max_output_tokens": 8, **extra}


async def test_a_stream_is_named_events_and_is_stored_once_complete(qwen_meta_dir: Path) -> None:
    state, _ = make_gateway(qwen_meta_dir)
    async with client(state) as http:
        reply = await http.post("/v1/responses", json=body(stream=True))
    assert reply.status_code == 200 and "[DONE]" not in reply.text
    seen = events(reply.text)
    assert all(name == data["type"] for name, data in seen)
    assert [data["sequence_number"] for _, data in seen] == list(range(len(seen)))
    assert seen[-1][0] == "response.completed"
    final = seen[-1][1]["response"]
    assert state.history is not None
    stored = await state.history.get("", final["id"])
    assert stored is not None and stored.response == final
    assert final["output"][0]["content"][0]["text"] == "hello there"


async def test_a_stream_that_breaks_ends_failed_and_cannot_be_continued(
    qwen_meta_dir: Path,
) -> None:
    state, _ = make_gateway(qwen_meta_dir)
    state.dispatcher = BreaksMidStream(state.model)  # type: ignore[arg-type]
    async with client(state) as http:
        reply = await http.post("/v1/responses", json=body(stream=True))
        name, last = events(reply.text)[-1]
        assert name == "response.failed"
        failed = last["response"]
        assert failed["status"] == "failed"
        assert failed["error"]["code"] == "decode_stream_error"
        assert state.history is not None
        stored = await state.history.get("", failed["id"])
        assert stored is not None and stored.status == "failed"
        state.dispatcher = ScriptedDispatcher(state.model)  # type: ignore[arg-type]
        again = await http.post("/v1/responses", json=body(previous_response_id=failed["id"]))
    assert again.status_code == 400
    assert again.json()["error"]["param"] == "previous_response_id"


class BrokenStore:
    """A history backend whose writes fail (a database gone away)."""

    name = "memory"

    async def put(self, item: StoredResponse) -> None:
        raise HistoryError("postgres db.internal.example:5432/tandem as tandem: connection lost")

    async def chain(self, tenant: str, response_id: str) -> None:
        return None


@pytest.mark.parametrize("stream", [False, True])
async def test_a_response_that_cannot_be_stored_says_so(qwen_meta_dir: Path, stream: bool) -> None:
    state, _ = make_gateway(qwen_meta_dir)
    state.history = BrokenStore()  # type: ignore[assignment]
    counted = {"200": "", "503": "history_unavailable"}
    before = {status: _requests(status, code) for status, code in counted.items()}
    async with client(state) as http:
        reply = await http.post("/v1/responses", json=body(stream=stream))
    # Counted (and access-logged) as what the client was told, not as the answer before it.
    grew = {status: _requests(status, code) - before[status] for status, code in counted.items()}
    assert grew == {"200": 0, "503": 1}
    if stream:
        name, last = events(reply.text)[-1]
        assert name == "response.failed"
        error = last["response"]["error"]
    else:
        assert reply.status_code == 503
        error = reply.json()["error"]
    assert error["code"] == "history_unavailable"
    assert "db.internal" not in error["message"]  # the database's address stays in the log


def _requests(status: str, code: str) -> float:
    labels = {"route": "responses", "status": status, "code": code}
    return metrics.REGISTRY.get_sample_value("tandem_requests_total", labels) or 0.0


async def test_store_false_is_answered_and_not_stored(qwen_meta_dir: Path) -> None:
    state, _ = make_gateway(qwen_meta_dir)
    async with client(state) as http:
        reply = await http.post("/v1/responses", json=body(store=False))
        assert reply.status_code == 200 and reply.json()["store"] is False
        missing = await http.get(f"/v1/responses/{reply.json()['id']}")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "response_not_found"


async def test_without_a_backend_store_true_is_refused(qwen_meta_dir: Path) -> None:
    state, _ = make_gateway(qwen_meta_dir, history_backend="none")
    async with client(state) as http:
        implicit = await http.post("/v1/responses", json=body())
        explicit = await http.post("/v1/responses", json=body(store=True))
    assert implicit.status_code == 200 and implicit.json()["store"] is False
    assert explicit.status_code == 400 and explicit.json()["error"]["param"] == "store"


async def test_input_items_pages(qwen_meta_dir: Path) -> None:
    state, _ = make_gateway(qwen_meta_dir)
    items = [{"role": "user", "content": f"part {i}"} for i in range(5)]
    async with client(state) as http:
        created = (await http.post("/v1/responses", json=body(input=items))).json()
        url = f"/v1/responses/{created['id']}/input_items"
        first = (await http.get(url, params={"limit": 2, "order": "asc"})).json()
        rest = (
            await http.get(url, params={"limit": 10, "order": "asc", "after": first["last_id"]})
        ).json()
        desc = (await http.get(url)).json()
        bad = await http.get(url, params={"limit": 0})
        # "²".isdigit() is true and int("²") raises: once a plain-text 500.
        superscript = await http.get(url, params={"limit": "²"})
    texts = [i["content"][0]["text"] for i in first["data"] + rest["data"]]
    assert texts == [f"part {i}" for i in range(5)]
    assert first["has_more"] is True and rest["has_more"] is False
    assert [i["id"] for i in desc["data"]] == [
        i["id"] for i in reversed(first["data"] + rest["data"])
    ]
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "limit"
    assert superscript.status_code == 400 and superscript.json()["error"]["param"] == "limit"


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "get_weather"}])
async def test_a_forced_tool_beside_text_format_is_answered(qwen_meta_dir: Path, choice) -> None:
    """instructor's RESPONSES_TOOLS mode sends both; it once got a 400 naming the chat field."""
    state, dispatcher = make_gateway(qwen_meta_dir)
    tool = {
        "type": "function",
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
    fmt = {"type": "json_schema", "name": "Out", "schema": {"type": "object"}}
    async with client(state) as http:
        reply = await http.post(
            "/v1/responses",
            json=body(tools=[tool], tool_choice=choice, text={"format": fmt}),
        )
    assert reply.status_code == 200, reply.text
    assert dispatcher.arrived == 1
