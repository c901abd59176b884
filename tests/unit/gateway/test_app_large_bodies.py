"""Large bodies: counted before parsing, parsed off the event loop, constraints capped.

A 15 MiB schema of small properties once held the gateway's GIL for about four seconds
(pydantic's parse, jsonschema_rs, json.dumps), freezing every stream. The real app
in-process over the scripted dispatcher.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from gateway_app_fakes import chat_body, client, make_gateway

from tandem.gateway import tokenizing
from tandem.gateway.body_shape import MAX_CONTAINERS, containers_over
from tandem.gateway.endpoints.common.structured import MAX_CONSTRAINT_CHARS

CHAT = "/v1/chat/completions"


def schema_of(properties: int, description: str = "") -> dict[str, Any]:
    one = {"type": "string", "description": description}
    return {"type": "object", "properties": {f"p{i}": one for i in range(properties)}}


def test_the_count_skips_strings_and_stops_at_the_limit() -> None:
    assert not containers_over(b'{"a": [1, 2, {"b": "{[{[{["}]}', 3)
    assert containers_over(b'{"a": [1, 2, {"b": []}]}', 3)
    assert not containers_over(json.dumps({"s": '\\"{' * 1000}).encode(), 1)  # escapes
    many = json.dumps([[]] * (MAX_CONTAINERS + 1)).encode()
    assert containers_over(many) and not containers_over(many, MAX_CONTAINERS + 2)


def _containers(value: Any) -> int:
    """Objects and arrays in a parsed JSON value: what containers_over counts in its text."""
    if isinstance(value, dict):
        return 1 + sum(_containers(v) for v in value.values())
    if isinstance(value, list):
        return 1 + sum(_containers(v) for v in value)
    return 0


def test_the_count_agrees_with_a_parse_at_every_limit() -> None:
    """The byte bound clears a body only when it truly is under the limit: bodies whose
    strings hold braces and brackets (bound over, count under) and bodies of data URLs
    (bound and count equal) are decided as the parsed value's own count decides them."""
    bodies = [
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "{[" * 40}]}]},
        {"tools": [{"parameters": {"type": "object", "enum": [[1], [2, [3]]]}}] * 3},
        {"url": "data:image/png;base64," + "QUJD" * 5000, "parts": [[], {}]},
        {"s": '\\"{[' * 30, "a": [{"b": ["]}"]}]},
    ]
    for value in bodies:
        raw = json.dumps(value).encode()
        exact = _containers(value)
        for limit in range(exact + 3):
            assert containers_over(raw, limit) == (exact > limit), (value, limit)


async def test_a_body_of_too_many_objects_is_413_before_parsing(
    qwen_meta_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state, dispatcher = make_gateway(qwen_meta_dir)
    parsed: list[int] = []
    real = tokenizing.check_body_shape

    def counting(raw: bytes) -> None:
        parsed.append(len(raw))
        real(raw)

    monkeypatch.setattr(tokenizing, "check_body_shape", counting)
    fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema_of(60_000)}}
    async with client(state) as http:
        answer = await http.post(CHAT, json={**chat_body(), "response_format": fmt})
        assert answer.status_code == 413, answer.text
        assert answer.json()["error"]["code"] == "payload_too_large"
        assert "JSON objects and arrays" in answer.json()["error"]["message"]
        # A large body of few values (one long string) is parsed as before, off the loop.
        text = "x" * (tokenizing.INLINE_BODY_BYTES + 10)
        long_one = {**chat_body(), "messages": [{"role": "user", "content": text}]}
        assert (await http.post(CHAT, json=long_one)).status_code == 400  # over the context
    assert len(parsed) == 2 and dispatcher.arrived == 0


@pytest.mark.parametrize(
    "fields",
    [
        {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": "S"}}},
        {"structured_outputs": {"json": "S"}},
        {"guided_json": "TEXT"},
        {"structured_outputs": {"regex": "R"}},
        {"guided_choice": "C"},
        {"tools": "T", "tool_choice": "required"},
    ],
)
async def test_a_constraint_over_the_cap_is_refused_naming_its_field(
    qwen_meta_dir: Path, fields: dict[str, Any]
) -> None:
    big = schema_of(1000, "d" * (MAX_CONSTRAINT_CHARS // 1000))  # few objects, long text
    filled = json.loads(
        json.dumps(fields)
        .replace('"S"', json.dumps(big))
        .replace('"TEXT"', json.dumps(json.dumps(big)))
        .replace('"R"', json.dumps("a" * (MAX_CONSTRAINT_CHARS + 1)))
        .replace('"C"', json.dumps(["c" * 1000] * (MAX_CONSTRAINT_CHARS // 1000 + 1)))
        .replace(
            '"T"',
            json.dumps([{"type": "function", "function": {"name": "f", "parameters": big}}]),
        )
    )
    state, dispatcher = make_gateway(qwen_meta_dir)
    async with client(state) as http:
        answer = await http.post(CHAT, json={**chat_body(), **filled})
    error = answer.json()["error"]
    assert (answer.status_code, error["code"]) == (400, "invalid_structured_output"), error
    assert "too large" in error["message"] and error["param"], error
    assert dispatcher.arrived == 0


async def test_large_bodies_are_parsed_on_the_tokenizing_pool(
    qwen_meta_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state, _ = make_gateway(qwen_meta_dir)
    threads: list[threading.Thread] = []
    real = tokenizing.check_body_shape

    def noting(raw: bytes) -> None:
        threads.append(threading.current_thread())
        real(raw)

    monkeypatch.setattr(tokenizing, "check_body_shape", noting)
    text = "y" * (tokenizing.INLINE_BODY_BYTES + 10)
    async with client(state) as http:
        for path, body in (
            (CHAT, {**chat_body(), "messages": [{"role": "user", "content": text}]}),
            ("/tokenize", {"prompt": text}),
            ("/detokenize", {"tokens": [104] * (tokenizing.INLINE_BODY_BYTES // 4)}),
        ):
            assert (await http.post(path, json=body)).status_code in (200, 400), path
    assert len(threads) == 3
    assert all(t.name.startswith("tandem-tokenize") for t in threads), threads
