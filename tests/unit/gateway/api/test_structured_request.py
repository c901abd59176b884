"""Output constraints in every spelling become one wire constraint, or a 400 naming the field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tandem.errors import TandemError
from tandem.gateway.backends.vllm.request import set_constraint
from tandem.gateway.endpoints.chat.schema import parse_chat_request
from tandem.gateway.endpoints.completions.schema import parse_completion_request
from tandem.gateway.pipeline.generation_request import Constraint
from tandem.wire.proto import pb

MESSAGES = [{"role": "user", "content": "Describe it."}]
SCHEMA = {
    "type": "object",
    "properties": {"colour": {"enum": ["red", "blue"]}, "count": {"type": "integer"}},
    "required": ["colour", "count"],
    "additionalProperties": False,
}
SCHEMA_TEXT = json.dumps(SCHEMA, separators=(",", ":"))


def chat_constraint(**fields: Any) -> Constraint | None:
    body = {"model": "m", "messages": MESSAGES, **fields}
    return parse_chat_request(json.dumps(body)).sampling().constraint


def refusal(**fields: Any) -> TandemError:
    with pytest.raises(TandemError) as info:
        chat_constraint(**fields)
    assert info.value.status == 400
    return info.value


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        (
            {"response_format": {"type": "json_object"}},
            Constraint("json_object", None, "response_format"),
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "thing", "schema": SCHEMA, "strict": True},
                }
            },
            Constraint("json_schema", SCHEMA_TEXT, "response_format.json_schema.schema"),
        ),
        (
            {"structured_outputs": {"json": SCHEMA}},
            Constraint("json_schema", SCHEMA_TEXT, "structured_outputs.json"),
        ),
        (
            {"structured_outputs": {"regex": "[a-c]{3}"}},
            Constraint("regex", "[a-c]{3}", "structured_outputs.regex"),
        ),
        (
            {"structured_outputs": {"choice": ["yes", "no"]}},
            Constraint("choice", ("yes", "no"), "structured_outputs.choice"),
        ),
        (
            {"structured_outputs": {"grammar": 'root ::= "a"'}},
            Constraint("grammar", 'root ::= "a"', "structured_outputs.grammar"),
        ),
        (
            {"structured_outputs": {"json_object": True}},
            Constraint("json_object", None, "structured_outputs.json_object"),
        ),
        (
            {"guided_json": json.dumps(SCHEMA)},
            Constraint("json_schema", SCHEMA_TEXT, "guided_json"),
        ),
        ({"guided_regex": "x+"}, Constraint("regex", "x+", "guided_regex")),
        ({"guided_choice": ["a"]}, Constraint("choice", ("a",), "guided_choice")),
        (
            {"guided_grammar": 'root ::= "b"'},
            Constraint("grammar", 'root ::= "b"', "guided_grammar"),
        ),
    ],
)
def test_each_spelling_becomes_one_constraint(fields: dict[str, Any], expected: Constraint) -> None:
    assert chat_constraint(**fields) == expected


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"response_format": {"type": "text"}},
        {"response_format": None, "guided_json": None},
        {"structured_outputs": {"json_object": False, "disable_any_whitespace": False}},
    ],
)
def test_no_constraint(fields: dict[str, Any]) -> None:
    assert chat_constraint(**fields) is None


def test_two_constraints_are_refused_naming_the_second() -> None:
    err = refusal(response_format={"type": "json_object"}, guided_regex="a+")
    assert (err.code, err.param) == ("invalid_request", "guided_regex")
    err = refusal(structured_outputs={"regex": "a", "choice": ["a"]})
    assert err.param == "structured_outputs.choice"


@pytest.mark.parametrize(
    ("fields", "code", "param"),
    [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "invalid_request",
            "response_format.json_schema.schema",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "objekt"}},
                }
            },
            "invalid_structured_output",
            "response_format.json_schema.schema",
        ),
        (
            {"structured_outputs": {"json": {"properties": {"a": {"pattern": "(["}}}}},
            "invalid_structured_output",
            "structured_outputs.json",
        ),
        ({"guided_json": "{not json"}, "invalid_structured_output", "guided_json"),
        ({"guided_json": [1, 2]}, "invalid_request", "guided_json"),
        # Deeper than Python's recursion limit: once a RecursionError and a 500.
        ({"guided_json": "[" * 5000 + "]" * 5000}, "invalid_structured_output", "guided_json"),
        (
            {"structured_outputs": {"json": '{"a":' * 3000 + "1" + "}" * 3000}},
            "invalid_structured_output",
            "structured_outputs.json",
        ),
        ({"guided_regex": "(unclosed"}, "invalid_structured_output", "guided_regex"),
        ({"guided_regex": ""}, "invalid_request", "guided_regex"),
        ({"guided_choice": []}, "invalid_request", "guided_choice"),
        ({"guided_choice": ["a", ""]}, "invalid_request", "guided_choice"),
        ({"guided_choice": "yes"}, "invalid_request", "guided_choice"),
        ({"guided_grammar": 7}, "invalid_request", "guided_grammar"),
        ({"response_format": {"type": "xml"}}, "invalid_request", "response_format.type"),
        ({"response_format": "json"}, "invalid_request", "response_format"),
        (
            {"response_format": {"type": "structural_tag", "structures": []}},
            "unsupported_parameter",
            "response_format",
        ),
        (
            {"structured_outputs": {"regex": "a", "disable_any_whitespace": True}},
            "unsupported_parameter",
            "structured_outputs.disable_any_whitespace",
        ),
        (
            {"structured_outputs": {"structural_tag": "{}"}},
            "unsupported_parameter",
            "structured_outputs.structural_tag",
        ),
        (
            {"structured_outputs": {"json_object": "yes"}},
            "invalid_request",
            "structured_outputs.json_object",
        ),
    ],
)
def test_bad_constraints_are_400s_naming_the_field(
    fields: dict[str, Any], code: str, param: str
) -> None:
    err = refusal(**fields)
    assert (err.code, err.param) == (code, param)
    assert param.split(".")[-1] in err.message or param.split(".")[0] in err.message


def test_completions_take_the_same_constraints() -> None:
    body = {"model": "m", "prompt": "p", "guided_choice": ["x", "y"]}
    constraint = parse_completion_request(json.dumps(body)).sampling().constraint
    assert constraint == Constraint("choice", ("x", "y"), "guided_choice")


@pytest.mark.parametrize(
    ("constraint", "field", "value"),
    [
        (Constraint("json_schema", SCHEMA_TEXT, "p"), "json_schema", SCHEMA_TEXT),
        (Constraint("regex", "a+", "p"), "regex", "a+"),
        (Constraint("grammar", 'root ::= "a"', "p"), "grammar", 'root ::= "a"'),
        (Constraint("json_object", None, "p"), "json_object", True),
    ],
)
def test_wire_oneof(constraint: Constraint, field: str, value: Any) -> None:
    params = pb.SamplingParams()
    set_constraint(params, constraint)
    assert params.WhichOneof("constraint") == field
    assert getattr(params, field) == value


def test_wire_choice() -> None:
    params = pb.SamplingParams()
    set_constraint(params, Constraint("choice", ("yes", "no"), "p"))
    assert params.WhichOneof("constraint") == "choice"
    assert list(params.choice.choices) == ["yes", "no"]


def test_logprobs_reach_the_summary() -> None:
    def chat_lp(**fields: Any) -> int | None:
        body = {"model": "m", "messages": MESSAGES, **fields}
        return parse_chat_request(json.dumps(body)).sampling().logprobs

    assert chat_lp() is None
    assert chat_lp(logprobs=False) is None
    assert chat_lp(logprobs=True) == 0
    assert chat_lp(logprobs=True, top_logprobs=5) == 5
    completion = parse_completion_request(json.dumps({"model": "m", "prompt": "p", "logprobs": 3}))
    assert completion.sampling().logprobs == 3
