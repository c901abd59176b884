"""Tool calls and reasoning output end to end: openai client → gateway → real workers.

Per model an aggregated worker and a PD pair behind gateways (Qwen also on the worker media
path, LLaVA also with a language-model-only decode worker), plus a Qwen gateway with the
``qwen3`` reasoning parser. The parsing is the gateway's; a forced ``tool_choice`` is a JSON
schema constraint built from the tool, so even these random-weight models answer with a
valid call. Every PD answer must equal the aggregated one, and a streamed answer must
reassemble to the non-streamed one.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import jsonschema_rs
import openai
import pytest
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from tandem.engine.builtin import resolve_model

from .image_server import png_bytes
from .processes import Proc, start_all

pytestmark = pytest.mark.slow

MODELS = {"qwen": "tiny-qwen3-vl", "llava": "tiny-llava-1.5"}
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
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Forecast.", "parameters": WEATHER},
    },
    {
        "type": "function",
        "function": {
            "name": "zoom",
            "parameters": {
                "type": "object",
                "properties": {"level": {"enum": [1, 2]}},
                "required": ["level"],
                "additionalProperties": False,
            },
        },
    },
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
# No logit_bias against whitespace: the workers' JSON grammars are compact by default
# (worker --json-whitespace), so a forced call cannot be padded until max_tokens.
PD_GATEWAYS = {"qwen": ["pd", "pd-worker-path"], "llava": ["pd", "lmo"]}


@pytest.fixture(scope="module")
def procs(model_cache: Path):
    names, specs = [], []
    for family, model in MODELS.items():
        for role in ("both", "prefill", "decode"):
            names.append(f"{family}-{role}")
            specs.append(["worker", "--model", model, "--role", role])
    names.append("llava-decode-lmo")
    specs.append(
        ["worker", "--model", MODELS["llava"], "--role", "decode", "--language-model-only"]
    )
    workers = dict(zip(names, start_all(specs), strict=True))

    def gateway(media: str, *legs: str, extra: tuple[str, ...] = ()) -> list[str]:
        base = ["gateway", "--port", "0", "--mm-processing", media, *extra]
        if len(legs) == 1:
            return [*base, "--worker-urls", workers[legs[0]].address]
        prefill, decode = (workers[leg].address for leg in legs)
        return [*base, "--pd-disaggregation", "--prefill", prefill, "--decode", decode]

    gateways = {
        "qwen-agg": gateway("router", "qwen-both"),
        "qwen-pd": gateway("router", "qwen-prefill", "qwen-decode"),
        "qwen-pd-worker-path": gateway("worker", "qwen-prefill", "qwen-decode"),
        "qwen-thinking": gateway("router", "qwen-both", extra=("--reasoning-parser", "qwen3")),
        "llava-agg": gateway("router", "llava-both"),
        "llava-pd": gateway("router", "llava-prefill", "llava-decode"),
        "llava-lmo": gateway("router", "llava-prefill", "llava-decode-lmo"),
    }
    started = dict(zip(gateways, start_all(list(gateways.values())), strict=True))
    yield started
    for proc in [*started.values(), *workers.values()]:
        proc.stop()


def client(gateway: Proc) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.address}/v1", api_key="x", max_retries=0)


def user_turn(text: str, image_seed: int | None = 3) -> dict[str, Any]:
    parts: list[dict[str, Any]] = []
    if image_seed is not None:
        url = "data:image/png;base64," + base64.b64encode(png_bytes(image_seed)).decode()
        parts.append({"type": "image_url", "image_url": {"url": url}})
    return {"role": "user", "content": [*parts, {"type": "text", "text": text}]}


def ask(gateway: Proc, family: str, stream: bool = False, **kwargs: Any) -> dict[str, Any]:
    """A greedy answer as {content, reasoning, calls: [(name, arguments)], finish}."""
    request = {
        "model": MODELS[family],
        "messages": kwargs.pop("messages", [user_turn("What is the weather there?")]),
        "max_tokens": kwargs.pop("max_tokens", 96),
        "temperature": 0,
        **kwargs,
    }
    api = client(gateway)
    if not stream:
        choice = api.chat.completions.create(**request).choices[0]
        message = choice.message
        calls = [(c.function.name, c.function.arguments) for c in message.tool_calls or []]
        ids = [c.id for c in message.tool_calls or []]
        assert all(i.startswith("call_") for i in ids) and len(set(ids)) == len(ids)
        reasoning = getattr(message, "reasoning_content", None)
        return {
            "content": message.content,
            "reasoning": reasoning,
            "calls": calls,
            "finish": choice.finish_reason,
        }
    content, reasoning, finish = [], [], None
    calls: dict[int, list[str]] = {}
    for chunk in api.chat.completions.create(stream=True, **request):
        choice = chunk.choices[0]
        delta = choice.delta
        content.append(delta.content or "")
        reasoning.append(getattr(delta, "reasoning_content", None) or "")
        for call in delta.tool_calls or []:
            if call.id is not None:  # a call's first delta: id and name, in index order
                assert call.index == len(calls) and call.function.name
                calls[call.index] = [call.function.name, call.function.arguments or ""]
            elif call.function and call.function.arguments:
                calls[call.index][1] += call.function.arguments
        finish = choice.finish_reason or finish
    return {
        "content": "".join(content) or None,
        "reasoning": "".join(reasoning) or None,
        "calls": [tuple(calls[i]) for i in sorted(calls)],
        "finish": finish,
    }


def assert_valid_calls(answer: dict[str, Any], names: set[str], finish: str = "tool_calls") -> None:
    assert answer["finish"] == finish and answer["calls"], answer
    for name, arguments in answer["calls"]:
        assert name in names
        assert jsonschema_rs.is_valid(SCHEMAS[name], json.loads(arguments)), arguments


FORCED = {
    "required": {"tool_choice": "required", "parallel_tool_calls": False},
    "named": {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
}


@pytest.mark.parametrize("family", MODELS)
@pytest.mark.parametrize("choice", FORCED)
def test_forced_calls_are_valid_identical_under_pd_and_streamed(
    procs: dict[str, Proc], family: str, choice: str
) -> None:
    extra = {"tools": TOOLS, **FORCED[choice]}
    reference = ask(procs[f"{family}-agg"], family, **extra)
    names = {"get_weather"} if choice == "named" else set(SCHEMAS)
    # A named choice ends "stop", as OpenAI's and vLLM's do: the client chose the call.
    assert_valid_calls(reference, names, "stop" if choice == "named" else "tool_calls")
    assert len(reference["calls"]) == 1  # named, or required without parallel calls
    assert ask(procs[f"{family}-agg"], family, stream=True, **extra) == reference
    for name in PD_GATEWAYS[family]:
        for stream in (False, True):
            assert ask(procs[f"{family}-{name}"], family, stream, **extra) == reference, name


@pytest.mark.parametrize("family", MODELS)
def test_required_with_two_tools_finishes_well_under_128_tokens_through_pd(
    procs: dict[str, Proc], family: str
) -> None:
    """What LangChain (``tool_choice="any"``), litellm and openai-agents send: with JSON
    grammars that allowed any whitespace, both models padded until ``max_tokens``."""
    for name in PD_GATEWAYS[family]:
        for question, seed in (("What is the weather there?", 3), ("Zoom in please", None)):
            reply = client(procs[f"{family}-{name}"]).chat.completions.create(
                model=MODELS[family],
                messages=[user_turn(question, seed)],
                tools=TOOLS,
                tool_choice="required",
                parallel_tool_calls=False,
                max_tokens=128,
                temperature=0,
            )
            choice = reply.choices[0]
            assert choice.finish_reason == "tool_calls", (name, choice)
            assert reply.usage is not None and reply.usage.completion_tokens < 100, reply.usage
            (call,) = choice.message.tool_calls or []
            assert jsonschema_rs.is_valid(
                SCHEMAS[call.function.name], json.loads(call.function.arguments)
            )


def test_required_with_parallel_calls_allows_several(procs: dict[str, Proc]) -> None:
    """The tiny models repeat calls until the limit; cut there, the calls begun are calls
    (the last with its arguments so far), streamed or not."""
    answer = ask(procs["qwen-pd"], "qwen", tools=TOOLS, tool_choice="required", max_tokens=200)
    assert (
        ask(procs["qwen-pd"], "qwen", True, tools=TOOLS, tool_choice="required", max_tokens=200)
        == answer
    )
    if answer["finish"] == "tool_calls":
        assert_valid_calls(answer, set(SCHEMAS))
    else:
        assert answer["finish"] == "length" and answer["content"] is None, answer
        assert len(answer["calls"]) >= 2
        whole = {**answer, "finish": "tool_calls", "calls": answer["calls"][:-1]}
        assert_valid_calls(whole, set(SCHEMAS))


def test_a_second_turn_with_calls_and_results_is_templated_like_transformers(
    procs: dict[str, Proc],
) -> None:
    first = [user_turn("Weather in Paris?", image_seed=None)]
    calls = [
        {
            "id": "call_abc",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'},
        }
    ]
    messages = [
        *first,
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "call_abc", "content": "sunny"},
    ]
    model_dir = resolve_model(MODELS["qwen"])
    expected = AutoTokenizer.from_pretrained(model_dir).apply_chat_template(
        messages, tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    ids = Tokenizer.from_file(str(model_dir / "tokenizer.json")).encode(
        expected, add_special_tokens=False
    )
    for name in ("qwen-agg", "qwen-pd"):
        reply = client(procs[name]).chat.completions.create(
            model=MODELS["qwen"], messages=messages, tools=TOOLS, max_tokens=4, temperature=0
        )
        assert reply.usage.prompt_tokens == len(ids.ids), name


def test_auto_extracts_a_call_the_model_writes(procs: dict[str, Proc]) -> None:
    # The model writes the Hermes format itself (here a regex makes it); the parser finds it.
    extra = {"tools": TOOLS, "extra_body": {"structured_outputs": {"regex": r"Sure\." + ZOOM_CALL}}}
    reference = ask(procs["qwen-agg"], "qwen", **extra)
    assert reference["content"] == "Sure."
    assert_valid_calls(reference, {"zoom"})
    assert ask(procs["qwen-agg"], "qwen", stream=True, **extra) == reference
    assert ask(procs["qwen-pd"], "qwen", stream=True, **extra) == reference


def test_a_half_finished_call_degrades_to_content(procs: dict[str, Proc]) -> None:
    half = r'<tool_call>\n\{"name": "zoom", "arguments": \{"lev'
    extra = {"tools": TOOLS, "extra_body": {"structured_outputs": {"regex": half}}}
    raw = half.replace("\\n", "\n").replace("\\", "")
    answer = ask(procs["qwen-pd"], "qwen", **extra)
    assert answer == {"content": raw, "reasoning": None, "calls": [], "finish": "stop"}
    # Streamed, the call's start had gone out before it broke; the rest comes as content
    # and the choice does not finish with "tool_calls".
    streamed = ask(procs["qwen-pd"], "qwen", stream=True, **extra)
    assert streamed["finish"] == "stop"
    assert [name for name, _ in streamed["calls"]] in ([], ["zoom"])


def test_tool_choice_none_leaves_the_tools_out(procs: dict[str, Proc]) -> None:
    with_none = ask(procs["qwen-agg"], "qwen", max_tokens=6, tools=TOOLS, tool_choice="none")
    without = ask(procs["qwen-agg"], "qwen", max_tokens=6)
    assert with_none == without and with_none["calls"] == []


def test_reasoning_is_split_off_streamed_and_not(procs: dict[str, Proc]) -> None:
    regex = "<think>[a-z]{4,8}</think>\n[a-z]{3,6}"
    extra = {"extra_body": {"structured_outputs": {"regex": regex}}}
    answer = ask(procs["qwen-thinking"], "qwen", **extra)
    assert answer["reasoning"] and answer["reasoning"].isalpha()
    assert answer["content"] and answer["content"].isalpha()
    assert "<think>" not in answer["content"] and answer["finish"] == "stop"
    assert ask(procs["qwen-thinking"], "qwen", stream=True, **extra) == answer
    # The same output through a gateway without the parser keeps the tags in the content.
    plain = ask(procs["qwen-agg"], "qwen", **extra)
    assert plain["content"] == f"<think>{answer['reasoning']}</think>\n{answer['content']}"


def test_tool_requests_the_template_cannot_serve_are_refused(procs: dict[str, Proc]) -> None:
    api = client(procs["qwen-agg"])
    with pytest.raises(openai.BadRequestError) as unknown:
        api.chat.completions.create(
            model=MODELS["qwen"],
            messages=[user_turn("hi", None)],
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "nope"}},
        )
    assert unknown.value.body["param"] == "tool_choice.function.name"
    # vLLM's own constraint fields beside a forced call are refused (a response_format is
    # not: it governs text answers, and the call's constraint applies; tests/unit).
    with pytest.raises(openai.BadRequestError) as two:
        api.chat.completions.create(
            model=MODELS["qwen"],
            messages=[user_turn("hi", None)],
            tools=TOOLS,
            tool_choice="required",
            extra_body={"structured_outputs": {"regex": "a+"}},
        )
    assert two.value.body["param"] == "structured_outputs.regex"


ZOOM_CALL = r'<tool_call>\n\{"name": "zoom", "arguments": \{"level": [12]\}\}\n</tool_call>'


def test_reasoning_first_then_calls(procs: dict[str, Proc]) -> None:
    regex = "<think>[a-z]{4,8}</think>\n" + ZOOM_CALL
    extra = {"tools": TOOLS, "extra_body": {"structured_outputs": {"regex": regex}}}
    answer = ask(procs["qwen-thinking"], "qwen", **extra)
    assert answer["reasoning"] and answer["reasoning"].isalpha()
    assert answer["content"] is None
    assert_valid_calls(answer, {"zoom"})
    assert ask(procs["qwen-thinking"], "qwen", stream=True, **extra) == answer


def test_auto_without_parallel_calls_keeps_the_first(procs: dict[str, Proc]) -> None:
    regex = ZOOM_CALL + r"\n" + ZOOM_CALL
    extra = {
        "tools": TOOLS,
        "max_tokens": 200,
        "extra_body": {"structured_outputs": {"regex": regex}},
    }
    assert len(ask(procs["qwen-agg"], "qwen", **extra)["calls"]) == 2
    single = {**extra, "parallel_tool_calls": False}
    for stream in (False, True):
        answer = ask(procs["qwen-pd"], "qwen", stream, **single)
        assert len(answer["calls"]) == 1, answer
        assert_valid_calls(answer, {"zoom"})


ANSWER = {
    "type": "object",
    "properties": {"colour": {"enum": ["red", "green", "blue"]}},
    "required": ["colour"],
    "additionalProperties": False,
}
ANSWER_FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}
# "<" (the built-in models' ids are the bytes): the first character of a <tool_call> block.
TOWARDS_A_CALL = {str(ord("<")): 100}


@pytest.mark.parametrize("family", MODELS)
def test_auto_with_a_response_format_may_call_or_answer_in_the_format(
    procs: dict[str, Proc], family: str
) -> None:
    """One grammar over both: a call in the model's own syntax, or the formatted answer.
    Held to the format alone (vLLM's way), a call could never be written: steered towards
    one, the model still had to answer JSON."""
    for name in PD_GATEWAYS[family]:
        gateway = procs[f"{family}-{name}"]
        common = {"tools": TOOLS, "response_format": ANSWER_FORMAT, "max_tokens": 96}
        answer = ask(gateway, family, **common)
        assert answer["finish"] == "stop" and not answer["calls"], answer
        assert jsonschema_rs.is_valid(ANSWER, json.loads(answer["content"])), answer
        steer = {"logit_bias": TOWARDS_A_CALL, "parallel_tool_calls": False, **common}
        called = ask(gateway, family, **steer)
        assert_valid_calls(called, set(SCHEMAS))
        assert len(called["calls"]) == 1, called
        assert ask(gateway, family, True, **steer) == called
        # Parallel calls allowed, the tiny models may repeat them until the limit: cut, the
        # calls begun are calls all the same.
        several = ask(gateway, family, logit_bias=TOWARDS_A_CALL, **common)
        assert several["calls"][0] == called["calls"][0], several
        assert several["finish"] in ("tool_calls", "length"), several
