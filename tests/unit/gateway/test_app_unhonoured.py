"""A field Tandem cannot honour yet is a 400 naming it, never a 200 that ignored it.

Through the real app in-process (scripted worker side), with the official openai client.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from gateway_app_fakes import MODEL, make_gateway

from tandem.errors import TandemError
from tandem.gateway.app import build_app
from tandem.gateway.endpoints.chat.schema import parse_chat_request
from tandem.gateway.endpoints.completions.schema import parse_completion_request

MESSAGES = [{"role": "user", "content": "Describe it as JSON."}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}

REFUSED_CHAT: list[tuple[str, Any]] = [
    ("functions", [TOOL["function"]]),
    ("function_call", "auto"),
    ("prompt_logprobs", 1),
    ("guided_decoding_backend", "outlines"),
    ("guided_whitespace_pattern", r"\s*"),
    ("reasoning_effort", "high"),
    ("store", True),
    ("include_stop_str_in_output", True),
    ("allowed_token_ids", [1, 2]),
    ("use_beam_search", True),
    ("spaces_between_special_tokens", False),
    ("add_generation_prompt", False),
    ("chat_template_kwargs", {"enable_thinking": True}),
    ("echo", True),
    # Accepted and ignored until round 3 of hardening (issue 30, item 18).
    ("cache_salt", "tenant-a"),
    ("add_special_tokens", True),
    ("verbosity", "low"),
    ("logits_processors", ["my.module:Processor"]),
    ("return_token_ids", True),
]


def api(state: Any) -> openai.AsyncOpenAI:
    transport = httpx.ASGITransport(app=build_app(state))
    http = httpx.AsyncClient(transport=transport, base_url="http://gateway.test/v1")
    return openai.AsyncOpenAI(
        base_url="http://gateway.test/v1", api_key="x", http_client=http, max_retries=0
    )


@pytest.mark.parametrize("field,value", REFUSED_CHAT)
async def test_chat_refuses_what_it_would_ignore(
    qwen_meta_dir: Path, field: str, value: Any
) -> None:
    state, dispatcher = make_gateway(qwen_meta_dir)
    async with api(state) as client:
        with pytest.raises(openai.BadRequestError) as info:
            await client.chat.completions.create(
                model=MODEL, messages=MESSAGES, max_tokens=4, extra_body={field: value}
            )
    error = info.value.body
    assert isinstance(error, dict)
    assert error["code"] == "unsupported_parameter" and error["param"] == field
    assert field in error["message"]
    assert dispatcher.arrived == 0  # refused before anything reached a worker


async def test_do_nothing_values_are_accepted(qwen_meta_dir: Path) -> None:
    state, dispatcher = make_gateway(qwen_meta_dir)
    async with api(state) as client:
        answer = await client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            max_tokens=4,
            response_format={"type": "text"},
            tool_choice="none",
            logit_bias={},
            store=False,
            modalities=["text"],
        )
    assert answer.choices[0].message.content and dispatcher.arrived == 1


@pytest.mark.parametrize(
    "field,value", [("prompt_logprobs", 2), ("guided_decoding_backend", "xgrammar")]
)
def test_completions_refuse_them_too(field: str, value: Any) -> None:
    body = {"model": "m", "prompt": "hi", field: value}
    with pytest.raises(TandemError) as info:
        parse_completion_request(json.dumps(body))
    assert info.value.code == "unsupported_parameter" and info.value.param == field


def test_completions_keep_fields_chat_only_rules_name() -> None:
    # ``reasoning_effort`` means nothing to /v1/completions: an unknown extra, ignored there.
    body = {"model": "m", "prompt": "hi", "reasoning_effort": "high"}
    assert parse_completion_request(json.dumps(body))
    with pytest.raises(TandemError):
        chat = {"model": "m", "messages": MESSAGES, "reasoning_effort": "high"}
        parse_chat_request(json.dumps(chat))


def test_logit_bias_is_checked_not_refused() -> None:
    body = {"model": "m", "messages": MESSAGES, "logit_bias": {"42": 5, "7": -100}}
    assert parse_chat_request(json.dumps(body)).sampling().logit_bias == ((7, -100.0), (42, 5.0))
    for bad, param in (({"x": 1}, "logit_bias"), ({"1": 101}, "logit_bias.1")):
        with pytest.raises(TandemError) as info:
            parse_chat_request(json.dumps({**body, "logit_bias": bad}))
        assert info.value.code == "invalid_request" and info.value.param == param


async def test_logit_bias_outside_the_vocabulary_is_a_400(qwen_meta_dir: Path) -> None:
    state, dispatcher = make_gateway(qwen_meta_dir)
    async with api(state) as client:
        with pytest.raises(openai.BadRequestError) as info:
            await client.chat.completions.create(
                model=MODEL, messages=MESSAGES, max_tokens=4, logit_bias={"99999999": 5}
            )
    assert isinstance(info.value.body, dict) and info.value.body["param"] == "logit_bias"
    assert dispatcher.arrived == 0


@pytest.mark.parametrize("route", ["chat", "completions"])
async def test_stream_options_without_a_stream_are_refused(qwen_meta_dir: Path, route: str) -> None:
    state, dispatcher = make_gateway(qwen_meta_dir)
    async with api(state) as client:
        with pytest.raises(openai.BadRequestError) as info:
            options = {"stream_options": {"include_usage": True}}
            if route == "chat":
                await client.chat.completions.create(
                    model=MODEL, messages=MESSAGES, max_tokens=4, extra_body=options
                )
            else:
                await client.completions.create(
                    model=MODEL, prompt="hi", max_tokens=4, extra_body=options
                )
    error = info.value.body
    assert isinstance(error, dict)
    assert (error["code"], error["param"]) == ("invalid_request", "stream_options")
    assert dispatcher.arrived == 0
