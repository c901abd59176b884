"""tools / tool_choice in requests: the mode, the forcing constraint, the refusals."""

from __future__ import annotations

import json
from typing import Any

import jsonschema_rs
import pytest

from tandem.errors import TandemError
from tandem.gateway.endpoints.chat.schema import ChatCompletionRequest, parse_chat_request

MESSAGES = [{"role": "user", "content": "Weather?"}]
WEATHER = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Rome"]}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "noop"}},
]


def chat(**fields: Any) -> ChatCompletionRequest:
    return parse_chat_request(json.dumps({"model": "m", "messages": MESSAGES, **fields}))


def refusal(**fields: Any) -> TandemError:
    with pytest.raises(TandemError) as info:
        chat(**fields)
    assert info.value.status == 400
    return info.value


def test_modes() -> None:
    assert chat().tool_mode.kind == "none"
    assert chat(tools=TOOLS).tool_mode.kind == "auto"  # OpenAI's default with tools
    assert chat(tools=TOOLS, tool_choice="none").tool_mode.kind == "none"
    assert chat(tools=TOOLS, tool_choice="none").template_tools() is None
    assert chat(tools=TOOLS, tool_choice="auto").template_tools() == TOOLS
    named = chat(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "noop"}})
    assert (named.tool_mode.kind, named.tool_mode.name) == ("named", "noop")
    assert chat(tools=TOOLS).sampling().constraint is None  # auto decodes freely


def test_required_is_an_array_of_the_tools_calls() -> None:
    for parallel, one_at_most in ((True, False), (False, True)):
        constraint = (
            chat(tools=TOOLS, tool_choice="required", parallel_tool_calls=parallel)
            .sampling()
            .constraint
        )
        assert constraint is not None and constraint.kind == "json_schema"
        assert constraint.param == "tool_choice"
        assert isinstance(constraint.value, str)
        schema = json.loads(constraint.value)
        good = [{"name": "get_weather", "parameters": {"city": "Rome"}}]
        two = [*good, {"name": "noop", "parameters": {}}]
        assert jsonschema_rs.is_valid(schema, good)
        assert jsonschema_rs.is_valid(schema, two) is not one_at_most
        assert not jsonschema_rs.is_valid(schema, [])
        assert not jsonschema_rs.is_valid(schema, [{"name": "get_weather", "parameters": {}}])
        assert not jsonschema_rs.is_valid(schema, [{"name": "other", "parameters": {}}])


def test_named_is_the_functions_arguments() -> None:
    constraint = (
        chat(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}})
        .sampling()
        .constraint
    )
    assert constraint is not None and isinstance(constraint.value, str)
    assert json.loads(constraint.value) == WEATHER
    # A function without parameters takes the empty object only.
    empty = chat(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "noop"}})
    value = empty.sampling().constraint.value  # type: ignore[union-attr]
    assert isinstance(value, str) and not jsonschema_rs.is_valid(json.loads(value), {"a": 1})


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tool_choice": "required"}, "tool_choice"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice.function.name",
        ),
        ({"tools": [TOOLS[0], TOOLS[0]]}, "tools"),
        (
            {"tools": [{"type": "function", "function": {"name": "bad name"}}]},
            "tools.0.function.name",
        ),
        ({"tools": [{"type": "retrieval"}]}, "tools.0.type"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        (
            {"tools": TOOLS, "tool_choice": "required", "guided_regex": "a"},
            "guided_regex",
        ),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "f", "parameters": {"type": "objekt"}},
                    }
                ]
            },
            "tools.0.function.parameters",
        ),
    ],
)
def test_refusals_name_the_field(fields: dict[str, Any], param: str) -> None:
    assert refusal(**fields).param == param


def test_assistant_calls_and_tool_turns_reach_the_template() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "noop", "arguments": "{}"}}
    body = chat(
        tools=TOOLS,
        messages=[
            *MESSAGES,
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "done"},
        ],
    )
    rendered = body.template_messages()
    assert rendered[1]["tool_calls"] == [call] and rendered[1]["content"] is None
    assert rendered[2] == {"role": "tool", "content": "done", "tool_call_id": "call_1"}


def _pydantic_tools() -> list[dict[str, Any]]:
    """Two tools as the Agents SDK and LangChain send them: pydantic's schemas, whose nested
    models and enums live in ``$defs``; both define a ``Unit``, differently."""
    from enum import StrEnum

    from pydantic import BaseModel

    class Unit(StrEnum):
        celsius = "celsius"
        fahrenheit = "fahrenheit"

    class Place(BaseModel):
        city: str
        country: str

    class Weather(BaseModel):
        place: Place
        unit: Unit

    class Length(StrEnum):  # named Unit in the schema below: a clash with the other tool
        metre = "m"

    class Distance(BaseModel):
        start: Place
        end: Place
        unit: Length

    distance = Distance.model_json_schema()
    distance["$defs"]["Unit"] = distance["$defs"].pop("Length")
    distance["properties"]["unit"] = {"$ref": "#/$defs/Unit"}
    return [
        {"type": "function", "function": {"name": n, "parameters": p}}
        for n, p in (("get_weather", Weather.model_json_schema()), ("distance", distance))
    ]


def test_required_resolves_the_tools_definitions(qwen_meta_dir: Any) -> None:
    """Nested under the array, each tool's "#/$defs/…" once pointed nowhere: xgrammar refused
    the schema and the client got 400 invalid_structured_output."""
    from tandem.engine.structured import StructuredCompiler
    from tandem.engine.structured_spec import Constraint as EngineConstraint

    tools = _pydantic_tools()
    constraint = chat(tools=tools, tool_choice="required").sampling().constraint
    assert constraint is not None and isinstance(constraint.value, str)
    schema = json.loads(constraint.value)
    assert set(schema["$defs"]) == {"Place", "Unit", "distance.Unit"}
    place = {"city": "Paris", "country": "FR"}
    weather = {"name": "get_weather", "parameters": {"place": place, "unit": "celsius"}}
    trip = {"name": "distance", "parameters": {"start": place, "end": place, "unit": "m"}}
    assert jsonschema_rs.is_valid(schema, [weather, trip])
    wrong_unit = {**trip, "parameters": {**trip["parameters"], "unit": "celsius"}}
    assert not jsonschema_rs.is_valid(schema, [wrong_unit])  # each tool keeps its own Unit
    assert not jsonschema_rs.is_valid(schema, [{**weather, "parameters": {"place": {}}}])
    compiler = StructuredCompiler(qwen_meta_dir, 300)
    compiler.compile(EngineConstraint("json_schema", constraint.value), [])  # xgrammar takes it


FORMAT = {"type": "json_schema", "json_schema": {"name": "Out", "schema": {"type": "object"}}}


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_weather"}}]
)
@pytest.mark.parametrize("response_format", [FORMAT, {"type": "json_object"}])
def test_a_forced_call_beside_a_response_format_is_constrained_by_the_call(
    choice: Any, response_format: dict[str, Any]
) -> None:
    """OpenAI accepts both (the format is for text answers, a forced call gives none);
    instructor's RESPONSES_TOOLS mode and every Agents SDK agent with an output type and a
    forced tool send them together, and once got a 400."""
    forced = chat(tools=TOOLS, tool_choice=choice).sampling().constraint
    both = chat(tools=TOOLS, tool_choice=choice, response_format=response_format)
    assert both.sampling().constraint == forced


def test_vllms_constraint_fields_beside_a_forced_call_stay_refused() -> None:
    err = refusal(tools=TOOLS, tool_choice="required", structured_outputs={"json": {}})
    assert err.param == "structured_outputs.json"
