"""Parsing of ``/tokenize`` and ``/detokenize`` bodies (vLLM's shapes), and the cut that
``continue_final_message`` makes in a rendered chat."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tandem.errors import TandemError
from tandem.gateway.endpoints.tokenize.route import open_final_message
from tandem.gateway.endpoints.tokenize.schema import (
    TokenizeChatRequest,
    TokenizePromptRequest,
    parse_detokenize_request,
    parse_tokenize_request,
)

USER = {"role": "user", "content": "hi"}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def refused(body: str) -> TandemError:
    with pytest.raises(TandemError) as caught:
        parse_tokenize_request(body)
    assert caught.value.status == 400
    return caught.value


def chat(**fields: Any) -> str:
    return json.dumps({"messages": [USER], **fields})


def test_the_prompt_form_adds_special_tokens_by_default() -> None:
    body = parse_tokenize_request('{"model": "m", "prompt": "hello"}')
    assert isinstance(body, TokenizePromptRequest)
    assert (body.model, body.prompt, body.add_special_tokens, body.return_token_strs) == (
        "m",
        "hello",
        True,
        False,
    )


def test_the_chat_form_follows_the_chat_route_by_default() -> None:
    body = parse_tokenize_request(chat())
    assert isinstance(body, TokenizeChatRequest)
    assert body.model is None  # optional, as in vLLM: the served model
    assert body.add_generation_prompt and not body.continue_final_message
    assert not body.add_special_tokens  # the template writes them
    assert body.template_messages() == [{"role": "user", "content": "hi"}]
    assert body.template_tools() is None


def test_null_means_the_default() -> None:
    body = parse_tokenize_request(
        chat(model=None, add_generation_prompt=None, return_token_strs=None, tools=None)
    )
    assert isinstance(body, TokenizeChatRequest)
    assert body.add_generation_prompt and not body.return_token_strs


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        ("[1]", None, "must be a JSON object"),
        ("{}", "prompt", "'prompt' (a string) or 'messages' (a chat) is required"),
        ('{"prompt": null}', "prompt", "is required"),
        ('{"prompt": 5}', "prompt", "valid string"),
        ('{"prompt": "a", "messages": [{"role": "user", "content": "b"}]}', "prompt", "not both"),
        ('{"messages": []}', "messages", "at least 1"),
        ('{"messages": [{"role": "robot", "content": "b"}]}', "messages.0.role", "role"),
        ('{"prompt": "a", "add_special_tokens": 1}', "add_special_tokens", "boolean"),
        ("{not json", None, "not valid JSON"),
    ],
)
def test_malformed_bodies_are_a_400_naming_the_field(
    body: str, param: str | None, says: str
) -> None:
    err = refused(body)
    assert err.code == "invalid_request"
    assert err.param == param
    assert says in err.message


def test_an_unknown_content_part_is_named() -> None:
    err = refused(chat(messages=[{"role": "user", "content": [{"type": "input_audio"}]}]))
    assert (err.code, err.param) == ("unsupported_content_part", "messages.0.content.0.type")


def test_continue_final_message_needs_add_generation_prompt_off() -> None:
    err = refused(chat(continue_final_message=True))  # add_generation_prompt defaults to true
    assert (err.code, err.param) == ("invalid_request", "continue_final_message")
    body = parse_tokenize_request(chat(continue_final_message=True, add_generation_prompt=False))
    assert isinstance(body, TokenizeChatRequest) and body.continue_final_message


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("chat_template", "{{ messages }}"),
        ("chat_template_kwargs", {"enable_thinking": False}),
        ("mm_processor_kwargs", {"max_pixels": 100}),
        ("media_io_kwargs", {"image": {"mode": "L"}}),
    ],
)
def test_fields_the_gateway_cannot_honour_are_refused(name: str, value: Any) -> None:
    err = refused(chat(**{name: value}))
    assert (err.code, err.param) == ("unsupported_parameter", name)
    assert f"remove '{name}'" in err.message
    # Their do-nothing values pass.
    for empty in (None, {}, ""):
        assert isinstance(parse_tokenize_request(chat(**{name: empty})), TokenizeChatRequest)


def test_tools_are_checked_as_on_the_chat_route() -> None:
    body = parse_tokenize_request(chat(tools=[TOOL]))
    assert isinstance(body, TokenizeChatRequest)
    assert body.template_tools() == [TOOL]
    err = refused(chat(tools=[TOOL, TOOL]))
    assert (err.code, err.param) == ("invalid_request", "tools")


def test_image_urls_and_final_text() -> None:
    url = "data:image/png;base64,AAAA"
    messages = [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
        },
    ]
    body = parse_tokenize_request(chat(messages=messages))
    assert isinstance(body, TokenizeChatRequest)
    assert body.image_urls() == [url]
    assert body.final_text() == "b"
    only_image = parse_tokenize_request(chat(messages=messages[:1]))
    assert isinstance(only_image, TokenizeChatRequest) and only_image.final_text() is None


def test_detokenize_bodies() -> None:
    assert parse_detokenize_request('{"tokens": [1, 2], "model": "m"}').tokens == [1, 2]
    assert parse_detokenize_request('{"tokens": []}').tokens == []
    for body, param in [
        ("{}", "tokens"),
        ('{"tokens": [-1]}', "tokens.0"),
        ('{"tokens": [1, "2"]}', "tokens.1"),
        ('{"tokens": [true]}', "tokens.0"),
        ('{"tokens": [4294967296]}', "tokens.0"),
    ]:
        with pytest.raises(TandemError) as caught:
            parse_detokenize_request(body)
        assert (caught.value.status, caught.value.code, caught.value.param) == (
            400,
            "invalid_request",
            param,
        )


def test_the_final_message_is_left_open() -> None:
    rendered = "<s>USER: hi ASSISTANT: Sure, </s>"
    # The template kept the trailing space: so does the cut.
    assert open_final_message(rendered, "Sure, ") == "<s>USER: hi ASSISTANT: Sure, "
    # A template that strips the message: cut right after its text.
    assert open_final_message("A: Sure,</s>", "Sure, ") == "A: Sure,"
    # The last occurrence counts (the text may also appear in an earlier turn).
    assert open_final_message("U: ok\nA: ok\n<end>", "ok") == "U: ok\nA: ok"


def test_a_final_message_the_template_does_not_show_is_refused() -> None:
    with pytest.raises(TandemError) as caught:
        open_final_message("A: something else", "Sure")
    assert (caught.value.code, caught.value.param) == ("invalid_request", "continue_final_message")
    with pytest.raises(TandemError) as caught:
        open_final_message("A: ", None)
    assert (caught.value.code, caught.value.param) == ("invalid_request", "messages")
