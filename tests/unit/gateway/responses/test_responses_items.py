"""Responses input items → stored items → chat messages, and the request's refusals."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tandem.errors import TandemError
from tandem.gateway.endpoints.responses.items import chat_messages, input_items
from tandem.gateway.endpoints.responses.request import parse_responses_request
from tandem.gateway.endpoints.responses.turn import Turn, responses_param
from tandem.gateway.history.store import HistoryLimits, StoredResponse
from tandem.gateway.pipeline.generation_request import ChatPrompt


def request(**fields: Any) -> Any:
    return parse_responses_request(json.dumps({"model": "m", **fields}))


def test_a_string_input_is_one_user_message() -> None:
    [item] = input_items(request(input="Hello"))
    assert item["type"] == "message" and item["role"] == "user"
    assert item["content"] == [{"type": "input_text", "text": "Hello"}]
    assert item["id"].startswith("msg_")
    assert chat_messages([item]) == [{"role": "user", "content": "Hello"}]


def test_items_become_the_chat_conversation() -> None:
    items = input_items(
        request(
            input=[
                {"role": "system", "content": "Be brief."},
                {
                    "type": "message",
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "What is this?"},
                        {"type": "input_image", "image_url": "data:image/png;base64,AA"},
                    ],
                },
                {
                    "type": "reasoning",
                    "summary": [],
                    "content": [{"type": "reasoning_text", "text": "hmm"}],
                },
                {"role": "assistant", "content": "Checking."},
                {"type": "function_call", "call_id": "c1", "name": "look", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "a cat"},
            ]
        )
    )
    messages = chat_messages(items)
    assert messages[0] == {"role": "system", "content": "Be brief."}
    assert messages[1]["content"][1] == {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64,AA"},
    }
    assistant = messages[2]
    assert assistant["content"] == "Checking." and assistant["reasoning_content"] == "hmm"
    assert assistant["tool_calls"][0]["function"] == {"name": "look", "arguments": "{}"}
    assert messages[3] == {"role": "tool", "tool_call_id": "c1", "content": "a cat"}
    assert len({item["id"] for item in items}) == len(items)


def test_given_ids_are_kept() -> None:
    [item] = input_items(request(input=[{"id": "msg_mine", "role": "user", "content": "x"}]))
    assert item["id"] == "msg_mine"


class _Chain:
    """A store that answers one chain (the contract's tests run the real backends)."""

    def __init__(self, chain: list[StoredResponse]) -> None:
        self._chain = chain

    async def chain(self, tenant: str, response_id: str) -> list[StoredResponse] | None:
        return self._chain if self._chain and self._chain[-1].id == response_id else None


def stored(rid: str, status: str = "completed") -> StoredResponse:
    user = {
        "type": "message",
        "id": "msg_u",
        "role": "user",
        "content": [{"type": "input_text", "text": "first"}],
    }
    answer = {
        "type": "message",
        "id": "msg_a",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "reply", "annotations": []}],
    }
    return StoredResponse(rid, "", None, 0.0, status, "m", {"output": [answer]}, [user])


async def test_earlier_turns_come_first_and_instructions_lead() -> None:
    turn = Turn(_Chain([stored("resp_1")]), HistoryLimits(), None)  # type: ignore[arg-type]
    body = {
        "model": "m",
        "input": "second",
        "previous_response_id": "resp_1",
        "instructions": "Be kind.",
    }
    request = await turn.parse(json.dumps(body).encode())
    assert isinstance(request.prompt, ChatPrompt)  # the chat form, converted
    roles = [(m["role"], m["content"]) for m in request.prompt.messages]
    assert roles == [
        ("system", "Be kind."),
        ("user", "first"),
        ("assistant", "reply"),
        ("user", "second"),
    ]


async def test_a_failed_turn_cannot_be_continued() -> None:
    turn = Turn(_Chain([stored("resp_1", "failed")]), HistoryLimits(), None)  # type: ignore[arg-type]
    body = {"model": "m", "input": "x", "previous_response_id": "resp_1"}
    with pytest.raises(TandemError) as err:
        await turn.parse(json.dumps(body).encode())
    assert err.value.param == "previous_response_id"


async def test_an_input_over_the_stored_size_is_refused_before_generation() -> None:
    turn = Turn(_Chain([]), HistoryLimits(max_response_bytes=100), None)  # type: ignore[arg-type]
    body = {"model": "m", "input": "x" * 200}
    with pytest.raises(TandemError) as err:
        await turn.parse(json.dumps(body).encode())
    assert err.value.param == "store"
    small = Turn(_Chain([]), HistoryLimits(max_response_bytes=100), None)  # type: ignore[arg-type]
    await small.parse(json.dumps({**body, "store": False}).encode())  # not stored: fine


@pytest.mark.parametrize(
    ("chat", "ours"),
    [
        ("response_format.json_schema.schema", "text.format"),
        ("max_completion_tokens", "max_output_tokens"),
        ("messages.2.content", "input"),
        ("tools.0.function.parameters", "tools.0.parameters"),
        ("tool_choice.function.name", "tool_choice.name"),
        ("seed", "seed"),
        (None, None),
    ],
)
def test_chat_params_are_named_as_the_responses_api_names_them(
    chat: str | None, ours: str | None
) -> None:
    assert responses_param(chat) == ours


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"input": "x", "conversation": "c", "previous_response_id": "r"}, "conversation"),
        ({"input": "x", "include": ["reasoning.encrypted_content"]}, "include.0"),
        (
            {"input": "x", "stream_options": {"include_obfuscation": True}},
            "stream_options.include_obfuscation",
        ),
        ({"input": "x", "metadata": {str(i): "v" for i in range(17)}}, "metadata"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input.0"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input.0.content.0",
        ),
    ],
)
def test_refused_fields_are_named(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(TandemError) as err:
        request(**fields)
    assert err.value.param == param and err.value.status == 400
