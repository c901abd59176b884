"""Response bodies: exact shapes, and the openai SDK's typed models accepting them."""

from __future__ import annotations

import json

from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from tandem.errors import make_error
from tandem.gateway.endpoints.common.openai_bodies import (
    ChatChunkBuilder,
    ChoiceOutput,
    TextChunkBuilder,
    Usage,
    chat_completion,
    new_response_id,
    text_completion,
)
from tandem.gateway.http.json_bodies import error_response, json_bytes

CHOICES = [ChoiceOutput(0, "a", "stop"), ChoiceOutput(1, "漢字", "length")]


def test_ids_are_prefixed_and_unique() -> None:
    ids = {new_response_id("chatcmpl") for _ in range(100)}
    assert len(ids) == 100 and all(i.startswith("chatcmpl-") for i in ids)


def test_json_bytes_is_compact_utf8() -> None:
    assert json_bytes({"t": "é漢", "n": None}) == '{"t":"é漢","n":null}'.encode()


def test_chat_completion_validates_as_sdk_model() -> None:
    body = chat_completion("chatcmpl-1", "m", 9, CHOICES, Usage(5, 4, cached_tokens=3))
    parsed = ChatCompletion.model_validate(json.loads(json_bytes(body)))
    assert parsed.object == "chat.completion" and parsed.created == 9
    assert [c.message.content for c in parsed.choices] == ["a", "漢字"]
    assert [c.finish_reason for c in parsed.choices] == ["stop", "length"]
    assert parsed.usage is not None and parsed.usage.total_tokens == 9


def test_text_completion_shape() -> None:
    body = text_completion("cmpl-1", "m", 9, CHOICES, Usage(1, 2))
    assert body["object"] == "text_completion"
    assert body["choices"][1] == {
        "index": 1,
        "text": "漢字",
        "logprobs": None,
        "finish_reason": "length",
    }
    assert Completion.model_validate(body).usage.completion_tokens == 2  # type: ignore[union-attr]


def test_chat_chunks() -> None:
    chunks = ChatChunkBuilder("chatcmpl-2", "m", 7)
    start, delta, finish = chunks.start(1), chunks.delta(1, "x"), chunks.finish(1, "stop")
    assert start["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert delta["choices"][0]["delta"] == {"content": "x"}
    assert finish["choices"][0]["delta"] == {} and finish["choices"][0]["finish_reason"] == "stop"
    for chunk in (start, delta, finish):
        assert "usage" not in chunk  # only present when the client asked for usage
        parsed = ChatCompletionChunk.model_validate(chunk)
        assert (parsed.id, parsed.model, parsed.created, parsed.choices[0].index) == (
            "chatcmpl-2",
            "m",
            7,
            1,
        )


def test_usage_chunk_has_no_choices() -> None:
    chunks = ChatChunkBuilder("chatcmpl-3", "m", 7, include_usage=True)
    assert chunks.delta(0, "x")["usage"] is None
    last = chunks.usage(Usage(3, 4))
    assert last["choices"] == [] and last["usage"]["total_tokens"] == 7
    assert last["object"] == "chat.completion.chunk"
    text_last = TextChunkBuilder("cmpl-3", "m", 7, include_usage=True).usage(Usage(1, 1))
    assert text_last["object"] == "text_completion" and text_last["choices"] == []


def test_text_chunks() -> None:
    chunks = TextChunkBuilder("cmpl-4", "m", 1)
    assert chunks.delta(0, "ab")["choices"] == [
        {"index": 0, "text": "ab", "logprobs": None, "finish_reason": None}
    ]
    assert chunks.finish(0, "stop")["choices"][0] == {
        "index": 0,
        "text": "",
        "logprobs": None,
        "finish_reason": "stop",
    }


def test_error_response() -> None:
    response = error_response(make_error("no_available_workers", "all down"))
    assert response.status_code == 503
    assert response.headers["content-type"] == "application/json"
    assert json.loads(response.body)["error"] == {
        "message": "all down",
        "type": "server_error",
        "param": None,
        "code": "no_available_workers",
    }
