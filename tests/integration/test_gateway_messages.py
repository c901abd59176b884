"""The Anthropic Messages API end to end: the official anthropic SDK → gateway → real workers.

Real workers (real forward passes of the trained tiny models) behind one gateway per mode:
tiny-qwen3-vl aggregated, sequential PD, parallel PD (``--pd-dispatch parallel``) and PD on
the worker media path (``--mm-processing worker``); tiny-llava-1.5 aggregated and PD with a
language-model-only decode worker. Every answer is greedy and must equal the chat route's
for the same prompt on the same gateway, and the aggregated answer; a picture's answer must
name its content (the red and blue circle probe). The aggregated Qwen gateway has an API
key, which the SDK sends as ``x-api-key`` (and, in one test, as a bearer token).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import anthropic
import httpx
import jsonschema_rs
import openai
import pytest

from tandem.engine.builtin_shapes import draw

from .processes import Proc, start_all

pytestmark = pytest.mark.slow

QWEN, LLAVA = "tiny-qwen3-vl", "tiny-llava-1.5"
KEY = "messages-key-0123456789"
MODES = {
    QWEN: ["qwen-agg", "qwen-pd", "qwen-pd-parallel", "qwen-pd-worker-path"],
    LLAVA: ["llava-agg", "llava-lmo"],
}
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"enum": ["Paris", "Rome", "Oslo"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 3},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS = [
    {"name": "get_weather", "description": "Forecast for a city.", "input_schema": WEATHER},
    {
        "name": "zoom",
        "input_schema": {
            "type": "object",
            "properties": {"level": {"enum": [1, 2]}},
            "required": ["level"],
            "additionalProperties": False,
        },
    },
]
GREEDY = {"extra_body": {"temperature": 0}}


@pytest.fixture(scope="module")
def procs(model_cache: Path):
    names = ["qwen-both", "qwen-prefill", "qwen-decode", "llava-both", "llava-prefill", "lmo"]
    specs = [
        ["worker", "--model", QWEN, "--role", "both"],
        ["worker", "--model", QWEN, "--role", "prefill"],
        ["worker", "--model", QWEN, "--role", "decode"],
        ["worker", "--model", LLAVA, "--role", "both"],
        ["worker", "--model", LLAVA, "--role", "prefill"],
        ["worker", "--model", LLAVA, "--role", "decode", "--language-model-only"],
    ]
    workers = start_all(specs)
    w = {name: proc.address for name, proc in zip(names, workers, strict=True)}

    def gateway(media: str, *legs: str) -> list[str]:
        return ["gateway", "--port", "0", "--mm-processing", media, *legs]

    def pd(prefill: str, decode: str) -> list[str]:
        return ["--pd-disaggregation", "--prefill", w[prefill], "--decode", w[decode]]

    specs_by_name = {
        "qwen-agg": gateway("router", "--worker-urls", w["qwen-both"], "--api-key", KEY),
        "qwen-pd": gateway("router", *pd("qwen-prefill", "qwen-decode")),
        "qwen-pd-parallel": gateway(
            "router", *pd("qwen-prefill", "qwen-decode"), "--pd-dispatch", "parallel"
        ),
        "qwen-pd-worker-path": gateway("worker", *pd("qwen-prefill", "qwen-decode")),
        "llava-agg": gateway("router", "--worker-urls", w["llava-both"]),
        "llava-lmo": gateway("router", *pd("llava-prefill", "lmo")),
    }
    gateways = dict(zip(specs_by_name, start_all(list(specs_by_name.values())), strict=True))
    yield gateways
    for proc in [*gateways.values(), *workers]:
        proc.stop()


def claude(gateway: Proc, **keys: Any) -> anthropic.Anthropic:
    keys = keys or {"api_key": KEY}
    return anthropic.Anthropic(base_url=gateway.address, max_retries=0, **keys)


def chat_text(gateway: Proc, model: str, messages: list[dict[str, Any]], **fields: Any) -> str:
    api = openai.OpenAI(base_url=f"{gateway.address}/v1", api_key=KEY, max_retries=0)
    answer = api.chat.completions.create(model=model, messages=messages, temperature=0, **fields)
    return answer.choices[0].message.content or ""


def circle(colour: str) -> str:
    return base64.b64encode(draw(colour, "circle", (128, 128)).png()).decode()


def picture_turn(colour: str, text: str = "What is in this picture?") -> list[dict[str, Any]]:
    source = {"type": "base64", "media_type": "image/png", "data": circle(colour)}
    return [
        {
            "role": "user",
            "content": [{"type": "image", "source": source}, {"type": "text", "text": text}],
        }
    ]


def as_chat(turn: list[dict[str, Any]]) -> list[dict[str, Any]]:
    image, text = turn[0]["content"]
    url = f"data:image/png;base64,{image['source']['data']}"
    parts = [
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": text["text"]},
    ]
    return [{"role": "user", "content": parts}]


@pytest.mark.parametrize("mode", [m for modes in MODES.values() for m in modes])
def test_a_picture_is_named_alike_by_messages_and_chat_streamed_and_not(procs, mode: str) -> None:
    model = QWEN if mode.startswith("qwen") else LLAVA
    gateway = procs[mode]
    client = claude(gateway)
    for colour in ("red", "blue"):
        turn = picture_turn(colour)
        message = client.messages.create(model=model, max_tokens=20, messages=turn, **GREEDY)
        [block] = message.content
        assert block.type == "text"
        assert block.text.strip() == f"a {colour} circle", (mode, block.text)
        assert message.stop_reason == "end_turn"
        assert block.text == chat_text(gateway, model, as_chat(turn), max_tokens=20)
        with client.messages.stream(model=model, max_tokens=20, messages=turn, **GREEDY) as stream:
            pieces = list(stream.text_stream)
            final = stream.get_final_message()
        assert "".join(pieces) == final.content[0].text == block.text  # type: ignore[union-attr]
        assert final.stop_reason == "end_turn"
        assert final.usage.input_tokens == message.usage.input_tokens
        assert final.usage.output_tokens == message.usage.output_tokens
        counted = client.messages.count_tokens(model=model, messages=turn)
        assert counted.input_tokens == message.usage.input_tokens


@pytest.mark.parametrize("model", [QWEN, LLAVA])
def test_every_mode_answers_a_text_request_as_the_aggregated_one(procs, model: str) -> None:
    turn = [{"role": "user", "content": "Name a colour."}]
    answers = []
    for mode in MODES[model]:
        client = claude(procs[mode])
        message = client.messages.create(
            model=model, max_tokens=8, system="Answer briefly.", messages=turn, **GREEDY
        )
        chat = [{"role": "system", "content": "Answer briefly."}, *turn]
        assert message.content[0].text == chat_text(procs[mode], model, chat, max_tokens=8)  # type: ignore[union-attr]
        counted = client.messages.count_tokens(model=model, system="Answer briefly.", messages=turn)
        assert counted.input_tokens == message.usage.input_tokens
        answers.append((message.content[0].text, message.stop_reason))  # type: ignore[union-attr]
    assert answers[0][0] and all(answer == answers[0] for answer in answers), answers


def tool_use(message: anthropic.types.Message) -> anthropic.types.ToolUseBlock:
    [block] = [b for b in message.content if b.type == "tool_use"]
    assert isinstance(block, anthropic.types.ToolUseBlock)
    return block


ANY, NAMED = {"type": "any"}, {"type": "tool", "name": "get_weather"}


@pytest.mark.parametrize(
    "mode,choice",
    [("qwen-agg", ANY), ("qwen-agg", NAMED), ("qwen-pd-parallel", ANY), ("llava-lmo", NAMED)],
)
def test_forced_tool_use_validates_against_its_schema(procs, mode: str, choice: dict) -> None:
    model = QWEN if mode.startswith("qwen") else LLAVA
    client = claude(procs[mode])
    request = {
        "model": model,
        "max_tokens": 128,
        "messages": [{"role": "user", "content": "What is the weather in Rome?"}],
        "tools": TOOLS,
        "tool_choice": {**choice, "disable_parallel_tool_use": True},
        **GREEDY,
    }
    message = client.messages.create(**request)
    call = tool_use(message)
    assert message.stop_reason == "tool_use"
    assert call.id.startswith("toolu_")
    schema = next(t["input_schema"] for t in TOOLS if t["name"] == call.name)
    jsonschema_rs.validate(schema, call.input)
    if choice["type"] == "tool":
        assert call.name == "get_weather"
    with client.messages.stream(**request) as stream:
        final = stream.get_final_message()
    streamed = tool_use(final)
    assert (streamed.name, streamed.input) == (call.name, call.input)
    assert final.stop_reason == "tool_use"


def as_function(tool: dict[str, Any]) -> dict[str, Any]:
    function = {"name": tool["name"], "parameters": tool["input_schema"]}
    if "description" in tool:
        function["description"] = tool["description"]
    return function


def test_a_tool_result_turn_renders_through_the_template(procs) -> None:
    gateway = procs["qwen-agg"]
    client = claude(gateway)
    asked = {"role": "user", "content": "What is the weather in Rome?"}
    call = {
        "type": "tool_use",
        "id": "toolu_1",
        "name": "get_weather",
        "input": {"city": "Rome", "days": 1},
    }
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny, 24 degrees."}
    history = [
        asked,
        {"role": "assistant", "content": [call]},
        {"role": "user", "content": [result]},
    ]
    counted = client.messages.count_tokens(model=QWEN, messages=history, tools=TOOLS)
    # The same conversation in chat's words, tokenized by the gateway's /tokenize.
    chat_history = [
        {"role": "user", "content": asked["content"]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": json.dumps(call["input"])},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny, 24 degrees."},
    ]
    chat_tools = [{"type": "function", "function": as_function(t)} for t in TOOLS]
    tokenized = httpx.post(
        f"{gateway.address}/v1/tokenize",
        json={"model": QWEN, "messages": chat_history, "tools": chat_tools},
        headers={"Authorization": f"Bearer {KEY}"},
    ).json()
    assert counted.input_tokens == tokenized["count"]
    without = client.messages.count_tokens(model=QWEN, messages=history[:1], tools=TOOLS)
    assert counted.input_tokens > without.input_tokens + 10  # the call and its result
    message = client.messages.create(
        model=QWEN, max_tokens=12, messages=history, tools=TOOLS, **GREEDY
    )
    assert message.usage.input_tokens == counted.input_tokens
    expected = chat_text(gateway, QWEN, chat_history, tools=chat_tools, max_tokens=12)
    assert "".join(b.text for b in message.content if b.type == "text") == expected


def test_stop_sequences_and_max_tokens_end_the_answer(procs) -> None:
    client = claude(procs["qwen-pd"])
    turn = picture_turn("red")
    whole = client.messages.create(model=QWEN, max_tokens=20, messages=turn, **GREEDY)
    text = whole.content[0].text  # type: ignore[union-attr]
    stop = text.strip().split()[-1]  # "circle"
    stopped = client.messages.create(
        model=QWEN, max_tokens=20, messages=turn, stop_sequences=[stop], **GREEDY
    )
    assert stopped.content[0].text == text[: text.index(stop)]  # type: ignore[union-attr]
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", stop)
    assert stopped.usage.output_tokens < whole.usage.output_tokens
    with client.messages.stream(
        model=QWEN, max_tokens=20, messages=turn, stop_sequences=[stop], **GREEDY
    ) as stream:
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", stop)
    cut = client.messages.create(model=QWEN, max_tokens=2, messages=turn, **GREEDY)
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 2
    with client.messages.stream(model=QWEN, max_tokens=2, messages=turn, **GREEDY) as stream:
        assert stream.get_final_message().stop_reason == "max_tokens"


def test_keys_and_errors_reach_the_sdk_as_its_exception_classes(procs) -> None:
    gateway = procs["qwen-agg"]
    hello = [{"role": "user", "content": "Hello"}]
    bearer = claude(gateway, api_key=None, auth_token=KEY)
    assert bearer.messages.create(model=QWEN, max_tokens=2, messages=hello).usage.output_tokens == 2
    with pytest.raises(anthropic.AuthenticationError) as denied:
        claude(gateway, api_key="wrong").messages.create(model=QWEN, max_tokens=2, messages=hello)
    assert denied.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    client = claude(gateway)
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="no-such-model", max_tokens=2, messages=hello)
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(
            model=QWEN, max_tokens=2, messages=hello, extra_body={"top_logprobs": 2}
        )
    assert "top_logprobs" in refused.value.body["error"]["message"]  # type: ignore[index]
