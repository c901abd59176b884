"""The Responses API end to end: the official openai client → gateway → real workers.

Per deployment (tiny-qwen3-vl aggregated, PD on the router media path, PD on the worker
media path; tiny-llava-1.5 aggregated and PD with a language-model-only decode worker) a
response with an image must equal the same request through chat completions — the
Responses API is the chat pipeline under another shape. Streams are consumed with
``client.responses.stream`` to ``response.completed``; stored conversations continue over
three turns (images of earlier turns re-sent from the store: the prompt equals the chat
request with the whole history), and are retrieved, listed and deleted. Every gateway here
stores in its own SQLite file (the default backend); tenants are checked with tenant keys.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import openai
import pytest

from .image_server import png_bytes
from .processes import Proc, start_all

pytestmark = pytest.mark.slow

QWEN, LLAVA = "tiny-qwen3-vl", "tiny-llava-1.5"
MAX_TOKENS = 24
# No bias against whitespace: the workers' JSON grammars are compact by default.
SCHEMA = {
    "type": "object",
    "properties": {"colour": {"enum": ["red", "green", "blue"]}},
    "required": ["colour"],
    "additionalProperties": False,
}
JSON_FORMAT = {"format": {"type": "json_schema", "name": "thing", "schema": SCHEMA, "strict": True}}
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather of a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"enum": ["Paris", "Oslo"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
TENANT_KEYS = {"acme": "acme-key-0123456789", "globex": "globex-key-0123456789"}
GATEWAYS = {
    "qwen-agg": QWEN,
    "qwen-pd": QWEN,
    "qwen-pd-worker-path": QWEN,
    "llava-agg": LLAVA,
    "llava-lmo": LLAVA,
}


@pytest.fixture(scope="module")
def procs(model_cache: Path, tmp_path_factory: pytest.TempPathFactory):
    names = ["qwen-both", "qwen-prefill", "qwen-decode", "llava-both", "llava-prefill", "lmo"]
    specs = [
        ["worker", "--model", QWEN, "--role", "both"],
        ["worker", "--model", QWEN, "--role", "prefill"],
        ["worker", "--model", QWEN, "--role", "decode"],
        ["worker", "--model", LLAVA, "--role", "both"],
        ["worker", "--model", LLAVA, "--role", "prefill"],
        ["worker", "--model", LLAVA, "--role", "decode", "--language-model-only"],
    ]
    workers = dict(zip(names, start_all(specs), strict=True))
    w = {name: proc.address for name, proc in workers.items()}
    db = tmp_path_factory.mktemp("responses-db")

    def gateway(name: str, media: str, *legs: str) -> list[str]:
        store = ["--history-sqlite-path", str(db / f"{name}.sqlite3")]
        return ["gateway", "--port", "0", "--mm-processing", media, *store, *legs]

    def pd(prefill: str, decode: str) -> list[str]:
        return ["--pd-disaggregation", "--prefill", w[prefill], "--decode", w[decode]]

    tenants = [a for t, k in TENANT_KEYS.items() for a in ("--tenant-api-key", f"{t}:{k}")]
    gw_specs = {
        "qwen-agg": gateway("qwen-agg", "router", "--worker-urls", w["qwen-both"]),
        "qwen-pd": gateway("qwen-pd", "router", *pd("qwen-prefill", "qwen-decode")),
        "qwen-pd-worker-path": gateway("qwen-pdw", "worker", *pd("qwen-prefill", "qwen-decode")),
        "llava-agg": gateway("llava-agg", "router", "--worker-urls", w["llava-both"]),
        "llava-lmo": gateway("llava-lmo", "router", *pd("llava-prefill", "lmo")),
        "tenants": gateway("tenants", "router", "--worker-urls", w["qwen-both"], *tenants),
        "thinking": gateway(
            "thinking", "router", "--worker-urls", w["qwen-both"], "--reasoning-parser", "qwen3"
        ),
    }
    gateways = dict(zip(gw_specs, start_all(list(gw_specs.values())), strict=True))
    yield gateways
    for proc in [*gateways.values(), *workers.values()]:
        proc.stop()


def client(gateway: Proc, key: str = "x") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.address}/v1", api_key=key, max_retries=0)


def data_url(seed: int) -> str:
    return "data:image/png;base64," + base64.b64encode(png_bytes(seed)).decode()


def image_input(seed: int, text: str = "Describe the picture.") -> list[dict[str, Any]]:
    parts = [
        {"type": "input_text", "text": text},
        {"type": "input_image", "image_url": data_url(seed)},
    ]
    return [{"role": "user", "content": parts}]


def chat_image_message(seed: int, text: str = "Describe the picture.") -> dict[str, Any]:
    parts = [
        {"type": "text", "text": text},
        {"type": "image_url", "image_url": {"url": data_url(seed)}},
    ]
    return {"role": "user", "content": parts}


def chat(gateway: Proc, model: str, messages: list[dict[str, Any]], **extra: Any) -> Any:
    return client(gateway).chat.completions.create(
        model=model, messages=messages, max_tokens=MAX_TOKENS, temperature=0, **extra
    )


@pytest.mark.parametrize("name", list(GATEWAYS))
def test_response_with_an_image_equals_the_chat_answer(procs, name: str) -> None:
    gateway, model = procs[name], GATEWAYS[name]
    response = client(gateway).responses.create(
        model=model,
        input=image_input(3),
        max_output_tokens=MAX_TOKENS,
        temperature=0,
    )
    reference = chat(gateway, model, [chat_image_message(3)])
    choice = reference.choices[0]
    assert response.output_text == choice.message.content
    assert response.usage.input_tokens == reference.usage.prompt_tokens
    assert response.usage.output_tokens == reference.usage.completion_tokens
    cut = choice.finish_reason == "length"
    assert response.status == ("incomplete" if cut else "completed")
    assert response.id.startswith("resp_") and response.object == "response"
    [message] = response.output
    assert message.type == "message" and message.role == "assistant"


@pytest.mark.parametrize("name", ["qwen-agg", "qwen-pd", "llava-lmo"])
def test_a_stream_is_consumed_to_completed(procs, name: str) -> None:
    gateway, model = procs[name], GATEWAYS[name]
    request = {
        "model": model,
        "input": image_input(5, "Which colour?"),
        "max_output_tokens": 40,
        "temperature": 0,
        "text": JSON_FORMAT,
    }
    api = client(gateway)
    kinds: list[str] = []
    with api.responses.stream(**request) as stream:
        for event in stream:
            kinds.append(event.type)
        final = stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds and "response.output_text.done" in kinds
    assert final.status == "completed"
    assert json.loads(final.output_text)["colour"] in ("red", "green", "blue")
    whole = api.responses.create(**request)
    assert whole.output_text == final.output_text
    assert whole.usage.input_tokens == final.usage.input_tokens
    assert api.responses.retrieve(final.id).output_text == final.output_text


def three_turns(gateway: Proc, model: str) -> Any:
    """Three turns over previous_response_id, each checked against chat with the whole
    history (earlier images included); the last response."""
    api = client(gateway)
    turns: list[tuple[int | None, str]] = [
        (11, "Describe the picture."),
        (None, "And the corners?"),
        (12, "Compare this one."),
    ]
    history: list[dict[str, Any]] = []
    previous = None
    for seed, text in turns:
        response = api.responses.create(
            model=model,
            input=text if seed is None else image_input(seed, text),
            previous_response_id=previous,
            max_output_tokens=MAX_TOKENS,
            temperature=0,
        )
        history.append(
            {"role": "user", "content": text} if seed is None else chat_image_message(seed, text)
        )
        reference = chat(gateway, model, history)
        assert response.output_text == reference.choices[0].message.content
        assert response.usage.input_tokens == reference.usage.prompt_tokens
        assert response.previous_response_id == previous
        history.append({"role": "assistant", "content": response.output_text})
        previous = response.id
    return response


@pytest.mark.parametrize("name", ["qwen-agg", "qwen-pd", "qwen-pd-worker-path", "llava-lmo"])
def test_previous_response_id_carries_three_turns_with_their_images(procs, name: str) -> None:
    three_turns(procs[name], GATEWAYS[name])


@pytest.mark.parametrize("name", ["qwen-agg", "qwen-pd", "llava-agg"])
def test_stored_images_keep_the_prefix_cache_warm(procs, name: str) -> None:
    """Re-sent from the store, the earlier turns' images hash as before: the decode worker
    finds their prefix cached. (A language-model-only decode worker keys its cache by the
    request's whole list of image hashes, docs/pd-contract.md, so a turn that adds an image
    misses there; its prefill leg still hits.)"""
    last = three_turns(procs[name], GATEWAYS[name])
    assert last.usage.input_tokens_details.cached_tokens > 0


def test_retrieve_list_and_delete(procs) -> None:
    api = client(procs["qwen-agg"])
    first = api.responses.create(
        model=QWEN,
        input=image_input(21),
        instructions="Be brief.",
        metadata={"case": "retrieve"},
        max_output_tokens=8,
        temperature=0,
    )
    second = api.responses.create(
        model=QWEN, input="More.", previous_response_id=first.id, max_output_tokens=8
    )
    got = api.responses.retrieve(first.id)
    assert got.output_text == first.output_text and got.metadata == {"case": "retrieve"}
    assert got.instructions == "Be brief."
    items = api.responses.input_items.list(first.id)
    [item] = items.data
    assert item.type == "message" and item.role == "user"
    kinds = [part.type for part in item.content]
    assert kinds == ["input_text", "input_image"]
    assert item.content[1].image_url == data_url(21)  # stored by value, as sent
    api.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        api.responses.retrieve(first.id)
    # The later turn keeps its row; continuing it finds its parent gone.
    assert api.responses.retrieve(second.id).id == second.id
    with pytest.raises(openai.BadRequestError) as broken:
        api.responses.create(model=QWEN, input="x", previous_response_id=second.id)
    assert broken.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.NotFoundError) as missing:
        api.responses.create(model=QWEN, input="x", previous_response_id="resp_nothing")
    assert missing.value.body["code"] == "response_not_found"


def test_store_false_keeps_nothing(procs) -> None:
    api = client(procs["qwen-agg"])
    response = api.responses.create(model=QWEN, input="Hi", store=False, max_output_tokens=4)
    assert response.store is False
    with pytest.raises(openai.NotFoundError):
        api.responses.retrieve(response.id)


@pytest.mark.parametrize("name", ["qwen-agg", "qwen-pd"])
def test_function_calls_and_their_outputs(procs, name: str) -> None:
    api = client(procs[name])
    named = {"type": "function", "name": "get_weather"}
    call = api.responses.create(
        model=QWEN,
        input=image_input(31, "Weather where this was taken?"),
        tools=[WEATHER_TOOL],
        tool_choice=named,
        max_output_tokens=40,
        temperature=0,
    )
    [item] = [o for o in call.output if o.type == "function_call"]
    assert item.name == "get_weather"
    assert json.loads(item.arguments)["city"] in ("Paris", "Oslo")
    follow = api.responses.create(
        model=QWEN,
        previous_response_id=call.id,
        input=[{"type": "function_call_output", "call_id": item.call_id, "output": "sunny"}],
        tools=[WEATHER_TOOL],
        max_output_tokens=MAX_TOKENS,
        temperature=0,
    )
    assert follow.status in ("completed", "incomplete")
    # The tool turn reached the template: the prompt grew by more than the output's text.
    assert follow.usage.input_tokens > call.usage.input_tokens + call.usage.output_tokens


def test_streamed_function_call(procs) -> None:
    api = client(procs["qwen-agg"])
    with api.responses.stream(
        model=QWEN,
        input="Weather?",
        tools=[WEATHER_TOOL],
        tool_choice="required",
        parallel_tool_calls=False,  # one call: the array ends (the tiny model may go on calling)
        max_output_tokens=160,
        temperature=0,
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert "response.function_call_arguments.delta" in kinds
    [item] = [o for o in final.output if o.type == "function_call"]
    assert json.loads(item.arguments)["city"] in ("Paris", "Oslo")


def test_logprobs_come_with_the_output_text(procs) -> None:
    api = client(procs["qwen-pd"])
    response = api.responses.create(
        model=QWEN,
        input=image_input(51),
        include=["message.output_text.logprobs"],
        top_logprobs=2,
        max_output_tokens=MAX_TOKENS,
        temperature=0,
    )
    reference = chat(
        procs["qwen-pd"], QWEN, [chat_image_message(51)], logprobs=True, top_logprobs=2
    )
    ours = response.output[0].content[0].logprobs
    theirs = reference.choices[0].logprobs.content
    assert [(e.token, e.logprob) for e in ours] == [(e.token, e.logprob) for e in theirs]
    assert all(len(e.top_logprobs) == 2 for e in ours)


def test_reasoning_comes_back_as_a_reasoning_item(procs) -> None:
    """Decoding held to ``<think>…</think>`` text (a regex) so that the parser has
    reasoning to split off; a later turn sends it back to the template."""
    api = client(procs["thinking"])
    request = {
        "model": QWEN,
        "input": "Think first.",
        "max_output_tokens": 40,
        "temperature": 0,
        "extra_body": {"structured_outputs": {"regex": "<think>[a-z]{4,8}</think>\n[a-z]{3,6}"}},
    }
    response = api.responses.create(**request)
    kinds = [item.type for item in response.output]
    assert kinds == ["reasoning", "message"], kinds
    thought = response.output[0].content[0].text
    assert thought.isalpha() and response.output_text.isalpha()
    assert response.usage.output_tokens_details.reasoning_tokens > 0
    with api.responses.stream(**request) as stream:
        deltas = [e.delta for e in stream if e.type == "response.reasoning_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == thought and final.output_text == response.output_text
    follow = api.responses.create(
        model=QWEN, input="Again.", previous_response_id=response.id, max_output_tokens=4
    )
    assert follow.status in ("completed", "incomplete")


def test_tenants_see_only_their_own_responses(procs) -> None:
    gateway = procs["tenants"]
    acme, globex = (client(gateway, TENANT_KEYS[t]) for t in ("acme", "globex"))
    mine = acme.responses.create(model=QWEN, input="Hi", max_output_tokens=4)
    assert acme.responses.retrieve(mine.id).id == mine.id
    with pytest.raises(openai.NotFoundError):
        globex.responses.retrieve(mine.id)
    with pytest.raises(openai.NotFoundError):
        globex.responses.input_items.list(mine.id)
    with pytest.raises(openai.NotFoundError):
        globex.responses.delete(mine.id)
    with pytest.raises(openai.NotFoundError):
        globex.responses.create(model=QWEN, input="x", previous_response_id=mine.id)
    assert acme.responses.retrieve(mine.id).id == mine.id  # globex's delete did nothing


@pytest.mark.parametrize(
    ("request_fields", "code", "param"),
    [
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
            "unsupported_content_part",
            "input.0.content.0",
        ),
        ({"tools": [{"type": "web_search"}]}, "unsupported_parameter", "tools.0"),
        ({"reasoning": {"effort": "high"}}, "unsupported_parameter", "reasoning.effort"),
        ({"background": True}, "unsupported_parameter", "background"),
        ({"truncation": "auto"}, "unsupported_parameter", "truncation"),
        ({"extra_body": {"n": 2}}, "unsupported_parameter", "n"),
        ({"extra_body": {"bad_words": ["x"]}}, "unsupported_parameter", "bad_words"),
        (
            {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": 5}}}},
            "invalid_structured_output",
            "text.format",
        ),
        ({"max_output_tokens": 0}, "invalid_request", "max_output_tokens"),
        ({"input": []}, "invalid_request", "input"),
        ({"model": "other"}, "model_not_found", "model"),
    ],
)
def test_refusals_name_the_responses_field(
    procs, request_fields: dict[str, Any], code: str, param: str
) -> None:
    request = {"model": QWEN, "input": "Hi", "max_output_tokens": 4, **request_fields}
    with pytest.raises(openai.APIStatusError) as err:
        client(procs["qwen-agg"]).responses.create(**request)
    body = err.value.body
    assert (body["code"], body["param"]) == (code, param), body
