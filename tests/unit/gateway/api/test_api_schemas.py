"""Request parsing: what the openai SDK sends parses; anything malformed is a clean 400."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tandem.errors import BadRequest, TandemError
from tandem.gateway.endpoints.chat.schema import ChatCompletionRequest, parse_chat_request
from tandem.gateway.endpoints.common.openai_bodies import (
    ChoiceOutput,
    chat_completion,
    text_completion,
)
from tandem.gateway.endpoints.completions.schema import (
    DEFAULT_COMPLETION_MAX_TOKENS,
    parse_completion_request,
)
from tandem.gateway.pipeline.events import Usage

USER_HI = [{"role": "user", "content": "hi"}]


def chat(**fields: Any) -> ChatCompletionRequest:
    return parse_chat_request(json.dumps({"model": "m", "messages": USER_HI, **fields}))


def sdk_bodies(call: Any) -> list[dict[str, Any]]:
    """Run ``call(client)`` against a fake server; return the JSON bodies the SDK sent."""
    sent: list[dict[str, Any]] = []
    usage = Usage(3, 1)

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        choice = [ChoiceOutput(0, "ok", "stop")]
        if request.url.path.endswith("/chat/completions"):
            body = chat_completion("chatcmpl-1", "m", 1, choice, usage)
        else:
            body = text_completion("cmpl-1", "m", 1, choice, usage)
        return httpx.Response(200, json=body)

    http = httpx.Client(transport=httpx.MockTransport(handler))
    client = openai.OpenAI(base_url="http://gateway.test/v1", api_key="x", http_client=http)
    call(client)
    return sent


def test_sdk_chat_request_round_trip() -> None:
    messages = [
        {"role": "system", "content": "be brief"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "compare"},
                {"type": "image_url", "image_url": {"url": "https://img.test/a.png"}},
                {
                    "type": "image_url",
                    "image_url": {"url": "data:image/png;base64,AA==", "detail": "low"},
                },
            ],
        },
        {"role": "assistant", "content": None},
        {
            "role": "user",
            "content": [{"type": "image_url", "image_url": {"url": "https://img.test/c"}}],
        },
    ]
    (body,) = sdk_bodies(
        lambda c: c.chat.completions.create(
            model="tiny-qwen3-vl",
            messages=messages,
            max_tokens=8,
            max_completion_tokens=5,
            temperature=0,
            top_p=0.5,
            seed=7,
            stop=["\n\n", "END"],
            n=2,
            user="someone",
            response_format={"type": "text"},
            extra_body={"top_k": -1, "min_p": 0.1, "ignore_eos": True, "stop_token_ids": [2]},
        )
    )
    request = parse_chat_request(json.dumps(body))
    assert request.model == "tiny-qwen3-vl"
    assert request.image_urls() == [
        "https://img.test/a.png",
        "data:image/png;base64,AA==",
        "https://img.test/c",
    ]
    s = request.sampling()
    assert (s.n, s.max_tokens, s.temperature, s.top_p, s.top_k, s.min_p) == (2, 5, 0, 0.5, 0, 0.1)
    assert (s.seed, s.stop, s.stop_token_ids, s.ignore_eos, s.greedy) == (
        7,
        ("\n\n", "END"),
        (2,),
        True,
        True,
    )
    assert request.template_messages()[2] == {"role": "assistant", "content": None}


def test_sdk_streaming_and_completion_requests_parse() -> None:
    def calls(client: openai.OpenAI) -> None:
        stream = client.chat.completions.create(
            model="m", messages=USER_HI, stream=True, stream_options={"include_usage": True}
        )
        stream.close()
        client.completions.create(model="m", prompt="Once", max_tokens=3, stop="x")
        client.completions.create(model="m", prompt=[1, 2, 3])

    chat_body, text_body, ids_body = sdk_bodies(calls)
    assert parse_chat_request(json.dumps(chat_body)).include_usage
    text = parse_completion_request(json.dumps(text_body))
    assert (text.prompt, text.sampling().max_tokens, text.stop) == ("Once", 3, ["x"])
    ids = parse_completion_request(json.dumps(ids_body))
    assert ids.prompt == [1, 2, 3]
    assert ids.sampling().max_tokens == DEFAULT_COMPLETION_MAX_TOKENS


def test_defaults_nulls_and_unknown_fields() -> None:
    request = chat(n=None, stop=None, temperature=None, metadata={"k": "v"}, frobnicate=True)
    s = request.sampling()
    assert (s.n, s.stop, s.temperature, s.max_tokens, s.top_p, s.greedy) == (
        1,
        (),
        None,
        None,
        1,
        False,
    )
    assert not request.stream and not request.include_usage
    assert chat(max_tokens=9).sampling().max_tokens == 9
    streamed = chat(stream=True, stream_options={"include_usage": False})
    assert streamed.stream and not streamed.include_usage


def test_image_url_as_plain_string() -> None:
    content = [
        {"type": "image_url", "image_url": "https://img.test/x"},
        {"type": "text", "text": "?"},
    ]
    request = parse_chat_request(
        json.dumps({"model": "m", "messages": [{"role": "user", "content": content}]})
    )
    assert request.image_urls() == ["https://img.test/x"]


def _content(parts: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": parts}]}


@pytest.mark.parametrize(
    ("fields", "param", "needle"),
    [
        ({"model": 3}, "model", "string"),
        ({"model": None}, "model", "string"),
        ({"messages": []}, "messages", "at least 1"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role", "'user'"),
        ({"messages": [{"content": "x"}]}, "messages.0.role", "required"),
        (_content(5), "messages.0.content", "string, a list of parts or null"),
        (_content([{"type": "text", "text": 5}]), "messages.0.content.0.text", "string"),
        (_content([{"text": "no type"}]), "messages.0.content.0", "'type'"),
        (_content(["bare"]), "messages.0.content.0", "'type'"),
        (
            _content([{"type": "image_url", "image_url": {}}]),
            "messages.0.content.0.image_url.url",
            "required",
        ),
        (
            _content([{"type": "image_url", "image_url": 4}]),
            "messages.0.content.0.image_url",
            "object",
        ),
        ({"n": 0}, "n", "greater than or equal to 1"),
        ({"n": 17}, "n", "less than or equal to 16"),
        ({"n": True}, "n", "integer"),
        ({"n": 1.5}, "n", "integer"),
        ({"max_tokens": 0}, "max_tokens", "greater"),
        ({"max_completion_tokens": "5"}, "max_completion_tokens", "integer"),
        ({"temperature": 2.5}, "temperature", "less than or equal to 2"),
        ({"temperature": "hot"}, "temperature", "number"),
        ({"top_p": 0}, "top_p", "greater than 0"),
        ({"top_p": 1.01}, "top_p", "less than or equal to 1"),
        ({"top_k": -2}, "top_k", "greater"),
        ({"min_p": 1.5}, "min_p", "less"),
        ({"seed": 2**31}, "seed", "less"),
        ({"seed": -(2**31) - 1}, "seed", "greater"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4"),
        ({"stop": ["ok", ""]}, "stop.1", "at least 1"),
        ({"stop": 5}, "stop", "array"),
        ({"stop_token_ids": [1, -1]}, "stop_token_ids.1", "greater"),
        ({"ignore_eos": "yes"}, "ignore_eos", "boolean"),
        ({"stream": 1}, "stream", "boolean"),
        ({"stream_options": {"include_usage": "y"}}, "stream_options.include_usage", "boolean"),
        ({"frequency_penalty": 3}, "frequency_penalty", "less"),
        ({"presence_penalty": -3}, "presence_penalty", "greater"),
        ({"repetition_penalty": 0}, "repetition_penalty", "greater than 0"),
        ({"top_logprobs": 2}, "top_logprobs", "needs logprobs set to true"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "less than or equal"),
        ({"logprobs": 1}, "logprobs", "boolean"),
        ({"min_tokens": 4, "max_completion_tokens": 3}, "min_tokens", "must not exceed"),
    ],
)
def test_chat_validation_errors(fields: dict[str, Any], param: str, needle: str) -> None:
    body = {"model": "m", "messages": USER_HI, **fields}
    with pytest.raises(BadRequest) as info:
        parse_chat_request(json.dumps(body))
    err = info.value
    assert (err.code, err.status, err.param) == ("invalid_request", 400, param)
    assert needle in err.message
    assert "pydantic" not in err.message


def test_accepted_edge_values() -> None:
    request = chat(logprobs=False, top_logprobs=0, temperature=2, top_p=1, seed=-(2**31), n=16)
    assert request.sampling().n == 16
    assert chat(stop="only").sampling().stop == ("only",)
    assert chat(min_tokens=3, max_tokens=3).sampling().min_tokens == 3


def test_unknown_content_part_type_is_named() -> None:
    parts = [{"type": "text", "text": "x"}, {"type": "input_audio", "input_audio": {"data": ""}}]
    with pytest.raises(BadRequest) as info:
        parse_chat_request(json.dumps({"model": "m", **_content(parts)}))
    assert info.value.code == "unsupported_content_part"
    assert info.value.param == "messages.0.content.1.type"
    assert "'input_audio'" in info.value.message


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"{", "not valid JSON"),
        (b"", "not valid JSON"),
        (b"[1]", "JSON object"),
        (b'"s"', "JSON object"),
    ],
)
def test_body_level_errors(body: bytes, needle: str) -> None:
    for parse in (parse_chat_request, parse_completion_request):
        with pytest.raises(BadRequest) as info:
            parse(body)
        assert info.value.code == "invalid_request" and info.value.param is None
        assert needle in info.value.message


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [("text", "text"), (["text"], "text"), ([5, 6], [5, 6]), ([[5, 6]], [5, 6]), ("", "")],
)
def test_completion_prompts(prompt: Any, expected: Any) -> None:
    assert parse_completion_request(json.dumps({"model": "m", "prompt": prompt})).prompt == expected


@pytest.mark.parametrize(
    ("fields", "param", "needle"),
    [
        ({"prompt": ["a", "b"]}, "prompt", "exactly one prompt"),
        ({"prompt": []}, "prompt", "at least 1"),
        ({"prompt": [1, "a"]}, "prompt.1", "integer"),
        ({"prompt": [-1]}, "prompt.0", "greater"),
        ({"prompt": 3}, "prompt", "string or a list of token ids"),
        ({"prompt": None}, "prompt", "string or a list of token ids"),
        ({"echo": True}, "echo", "not supported"),
        ({"suffix": "tail"}, "suffix", "not supported"),
        ({"logprobs": 6}, "logprobs", "less than or equal to 5"),
        ({"logprobs": -1}, "logprobs", "greater than or equal to 0"),
        ({"best_of": 2}, "best_of", "must equal n"),
        ({"min_tokens": DEFAULT_COMPLETION_MAX_TOKENS + 1}, "min_tokens", "must not exceed"),
    ],
)
def test_completion_validation_errors(fields: dict[str, Any], param: str, needle: str) -> None:
    with pytest.raises(BadRequest) as info:
        parse_completion_request(json.dumps({"model": "m", "prompt": "p", **fields}))
    assert (info.value.code, info.value.param) == ("invalid_request", param)
    assert needle in info.value.message


def test_completion_accepts_what_it_ignores() -> None:
    request = parse_completion_request(
        json.dumps({"model": "m", "prompt": "p", "echo": False, "suffix": None, "best_of": 1})
    )
    assert request.sampling().max_tokens == DEFAULT_COMPLETION_MAX_TOKENS


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
FIELDS = ["model", "messages", "n", "stop", "temperature", "stream_options", "max_tokens", "prompt"]


@settings(max_examples=200, deadline=None)
@given(
    field=st.sampled_from(FIELDS),
    value=json_values,
    content=json_values,
)
def test_fuzzed_bodies_parse_or_raise_a_tandem_400(field: str, value: Any, content: Any) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": content}], "prompt": "p"}
    body[field] = value
    for parse in (parse_chat_request, parse_completion_request):
        try:
            parse(json.dumps(body))
        except TandemError as err:
            assert err.status == 400
            assert err.code in ("invalid_request", "unsupported_content_part")
            assert err.param is None or err.param.split(".")[0] in body
