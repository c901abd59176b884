"""A Messages body becomes the GenerationRequest the chat route builds for the chat body it
means; every field is honoured or refused by name."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tandem.errors import TandemError
from tandem.gateway.endpoints.chat.route import chat_generation
from tandem.gateway.endpoints.messages.convert import generation
from tandem.gateway.endpoints.messages.schema import (
    parse_count_tokens_request,
    parse_messages_request,
)
from tandem.gateway.pipeline.generation_request import ChatPrompt, GenerationRequest

MODEL = "tiny-qwen3-vl"
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
PNG = "iVBORw0KGgo="  # any base64: conversion does not decode it


def convert(body: dict[str, Any], parser: str | None = None) -> GenerationRequest:
    return generation(parse_messages_request(json.dumps(body)), parser)


def chat(body: dict[str, Any]) -> GenerationRequest:
    return chat_generation(json.dumps(body).encode())


def refusal(body: dict[str, Any], parser: str | None = None) -> TandemError:
    with pytest.raises(TandemError) as info:
        convert(body, parser)
    return info.value


def test_a_text_request_is_the_chat_request() -> None:
    body = {
        "model": MODEL,
        "max_tokens": 7,
        "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
        "messages": [{"role": "user", "content": "Hi"}],
        "stop_sequences": ["\n\n"],
        "temperature": 0,
        "top_p": 0.5,
        "top_k": 3,
        "metadata": {"user_id": "u-1"},
        "service_tier": "auto",
    }
    expected = chat(
        {
            "model": MODEL,
            "max_tokens": 7,
            "messages": [
                {"role": "system", "content": "Be brief.\n\nBe kind."},
                {"role": "user", "content": "Hi"},
            ],
            "stop": ["\n\n"],
            "temperature": 0,
            "top_p": 0.5,
            "top_k": 3,
        }
    )
    assert convert(body) == expected


def test_images_tool_use_and_tool_results_map_onto_chat_messages() -> None:
    body = {
        "model": MODEL,
        "max_tokens": 5,
        "stream": True,
        "tools": [{"name": "weather", "description": "Forecast.", "input_schema": SCHEMA}],
        "tool_choice": {"type": "tool", "name": "weather", "disable_parallel_tool_use": True},
        "messages": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": PNG},
                    },
                    {"type": "image", "source": {"type": "url", "url": "https://img.test/a.png"}},
                    {"type": "text", "text": "Where?", "cache_control": {"type": "ephemeral"}},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "Paris, surely.", "signature": ""},
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "text", "text": "Checking."},
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "weather",
                        "input": {"city": "Paris"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": [{"type": "text", "text": "Sunny"}],
                    },
                    {"type": "text", "text": "And tomorrow?"},
                ],
            },
        ],
    }
    request = convert(body)
    expected = chat(
        {
            "model": MODEL,
            "max_tokens": 5,
            "stream": True,
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "weather",
                        "description": "Forecast.",
                        "parameters": SCHEMA,
                    },
                }
            ],
            "tool_choice": {"type": "function", "function": {"name": "weather"}},
            "parallel_tool_calls": False,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
                        {"type": "image_url", "image_url": {"url": "https://img.test/a.png"}},
                        {"type": "text", "text": "Where?"},
                    ],
                },
                {
                    "role": "assistant",
                    "content": "Checking.",
                    "reasoning_content": "Paris, surely.",
                    "tool_calls": [
                        {
                            "id": "toolu_1",
                            "type": "function",
                            "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny"},
                {"role": "user", "content": [{"type": "text", "text": "And tomorrow?"}]},
            ],
        }
    )
    assert request == expected
    assert request.tools.mode.kind == "named" and not request.tools.mode.parallel
    assert request.sampling.constraint is not None  # the forced call's schema
    assert isinstance(request.prompt, ChatPrompt) and len(request.prompt.media) == 2


@pytest.mark.parametrize(
    "choice,kind",
    [({"type": "auto"}, "auto"), ({"type": "any"}, "required"), ({"type": "none"}, "none")],
)
def test_tool_choice_kinds(choice: dict[str, Any], kind: str) -> None:
    body = {
        "model": MODEL,
        "max_tokens": 5,
        "messages": [{"role": "user", "content": "Hi"}],
        "tools": [{"name": "weather", "input_schema": SCHEMA}],
        "tool_choice": choice,
    }
    assert convert(body).tools.mode.kind == kind


def test_an_error_tool_result_says_so_to_the_model() -> None:
    turn = {"type": "tool_use", "id": "toolu_9", "name": "weather", "input": {}}
    result = {
        "type": "tool_result",
        "tool_use_id": "toolu_9",
        "content": "timeout",
        "is_error": True,
    }
    body = {
        "model": MODEL,
        "max_tokens": 5,
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": [turn]},
            {"role": "user", "content": [result]},
        ],
    }
    prompt = convert(body).prompt
    assert isinstance(prompt, ChatPrompt)
    assert prompt.messages[-1] == {
        "role": "tool",
        "tool_call_id": "toolu_9",
        "content": "Error: timeout",
    }


BASE: dict[str, Any] = {
    "model": MODEL,
    "max_tokens": 5,
    "messages": [{"role": "user", "content": "Hi"}],
}


@pytest.mark.parametrize(
    "extra,code,param",
    [
        ({"frobnicate": 1}, "unsupported_parameter", "frobnicate"),
        ({"n": 2}, "unsupported_parameter", "n"),
        ({"service_tier": "priority"}, "unsupported_parameter", "service_tier"),
        ({"container": "c-1"}, "unsupported_parameter", "container"),
        (
            {"mcp_servers": [{"type": "url", "url": "https://mcp.test"}]},
            "unsupported_parameter",
            "mcp_servers",
        ),
        ({"metadata": {"user_id": "u", "team": "x"}}, "invalid_request", "metadata.team"),
        (
            {"thinking": {"type": "enabled", "budget_tokens": 2048}},
            "unsupported_parameter",
            "thinking",
        ),
        ({"temperature": 1.5}, "invalid_request", "temperature"),
        ({"stop_sequences": ["a", "b", "c", "d", "e"]}, "invalid_request", "stop_sequences"),
        ({"tool_choice": {"type": "any"}}, "invalid_request", "tool_choice"),
        (
            {"tools": [{"name": "f", "input_schema": {"type": 3}}]},
            "invalid_structured_output",
            "tools.0.input_schema",
        ),
        (
            {
                "tools": [{"name": "f", "input_schema": SCHEMA}],
                "tool_choice": {"type": "tool", "name": "g"},
            },
            "invalid_request",
            "tool_choice.name",
        ),
        (
            {"tools": [{"type": "bash_20250124", "name": "bash", "input_schema": SCHEMA}]},
            "invalid_request",
            "tools.0.type",
        ),
    ],
)
def test_refusals_name_the_field(extra: dict[str, Any], code: str, param: str) -> None:
    err = refusal({**BASE, **extra})
    assert (err.code, err.param) == (code, param), err.message
    assert err.status == 400


@pytest.mark.parametrize(
    "content,code,param",
    [
        (
            [{"type": "document", "source": {}}],
            "unsupported_content_part",
            "messages.0.content.0.type",
        ),
        (
            [{"type": "text", "text": "x", "extra": 1}],
            "invalid_request",
            "messages.0.content.0.extra",
        ),
        (
            [
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/tiff", "data": "AA"},
                }
            ],
            "invalid_request",
            "messages.0.content.0.source.media_type",
        ),
        (
            [{"type": "tool_result", "tool_use_id": "toolu_x"}],
            "invalid_request",
            "messages.0.content.0.tool_use_id",
        ),
    ],
)
def test_bad_blocks_are_named(content: list[dict[str, Any]], code: str, param: str) -> None:
    err = refusal({**BASE, "messages": [{"role": "user", "content": content}]})
    assert (err.code, err.param) == (code, param), err.message


def test_max_tokens_is_required_and_thinking_needs_its_budget_below_it() -> None:
    err = refusal({"model": MODEL, "messages": BASE["messages"]})
    assert (err.code, err.param) == ("invalid_request", "max_tokens")
    thinking = {"type": "enabled", "budget_tokens": 2048}
    err = refusal({**BASE, "max_tokens": 2048, "thinking": thinking}, parser="qwen3")
    assert err.param == "thinking.budget_tokens"
    accepted = convert({**BASE, "max_tokens": 4096, "thinking": thinking}, parser="qwen3")
    assert accepted.sampling.max_tokens == 4096
    assert convert({**BASE, "thinking": {"type": "disabled"}}) == convert(BASE)


def test_a_system_role_in_messages_is_refused() -> None:
    err = refusal({**BASE, "messages": [{"role": "system", "content": "x"}]})
    assert err.param == "messages.0" and "system" in err.message


def test_count_tokens_takes_no_generation_fields() -> None:
    parse_count_tokens_request(json.dumps({"model": MODEL, "messages": BASE["messages"]}))
    with pytest.raises(TandemError) as info:
        parse_count_tokens_request(json.dumps(BASE))
    assert info.value.param == "max_tokens"
