"""``tool_choice: auto`` beside a response_format: one grammar over a call or the answer.

The structural tags are compiled by the real xgrammar against the built-in vocabulary and
walked byte by byte (ids are bytes there), and what they accept is read back by the same
tool-call parser the gateway uses, so a grammar that lets through text the parser would not
read as a call (or the answer) fails here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tandem.engine.structured import StructuredCompiler
from tandem.engine.structured_spec import Constraint as EngineConstraint
from tandem.gateway.endpoints.chat.schema import ChatCompletionRequest, parse_chat_request
from tandem.gateway.pipeline.answer_or_calls import answer_or_calls
from tandem.gateway.pipeline.generation_request import Constraint
from tandem.gateway.tools import tool_parser

STOP = 258  # tiny-qwen3-vl's <|im_end|>
PLACE = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
# Parameters with their own $defs (pydantic's nested models): they must resolve in the tag.
WEATHER = {
    "$defs": {"Place": PLACE},
    "type": "object",
    "properties": {"place": {"$ref": "#/$defs/Place"}},
    "required": ["place"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "noop"}},
]
ANSWER = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
FORMAT = {"type": "json_schema", "json_schema": {"name": "Out", "schema": ANSWER}}
WEATHER_CALL = '{"name": "get_weather", "arguments": {"place": {"city": "Oslo"}}}'
NOOP_CALL = '{"name": "noop", "arguments": {}}'


def chat(**fields: Any) -> ChatCompletionRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    return parse_chat_request(json.dumps(body).encode())


def union(parser: str, **fields: Any) -> Constraint | None:
    request = chat(tools=TOOLS, **fields).generation()
    answer = request.sampling.constraint
    assert answer is not None
    assert request.tools.specs
    return answer_or_calls(request.tools.specs, request.tools.mode, answer, parser)


@pytest.fixture(scope="module")
def compiler(qwen_meta_dir: Path) -> StructuredCompiler:
    return StructuredCompiler(qwen_meta_dir, 263)


def accepts(compiler: StructuredCompiler, constraint: Constraint, text: str) -> bool:
    assert isinstance(constraint.value, str)
    compiled = compiler.compile(EngineConstraint("structural_tag", constraint.value), [STOP])
    matcher = compiled.matcher()
    return all(matcher.accept(t) for t in [*text.encode(), STOP]) and matcher.terminated


def hermes(*calls: str) -> str:
    return "\n".join(f"<tool_call>\n{call}\n</tool_call>" for call in calls)


def test_hermes_union_takes_calls_or_the_answer_and_nothing_else(
    compiler: StructuredCompiler,
) -> None:
    constraint = union("hermes", response_format=FORMAT)
    assert constraint is not None and constraint.kind == "structural_tag"
    assert constraint.param == "response_format.json_schema.schema"
    for text in (hermes(WEATHER_CALL), hermes(NOOP_CALL, WEATHER_CALL), '{"n": 3}'):
        assert accepts(compiler, constraint, text), text
    content, calls = tool_parser("hermes").parse(hermes(NOOP_CALL, WEATHER_CALL))
    assert (content, [(c.name, json.loads(c.arguments)) for c in calls]) == (
        "",
        [("noop", {}), ("get_weather", {"place": {"city": "Oslo"}})],
    )
    wrong = (
        "plain text",
        '{"n": "three"}',  # the answer's schema holds
        hermes('{"name": "get_weather", "arguments": {"place": {}}}'),  # $defs resolved
        hermes('{"name": "other", "arguments": {}}'),  # only the tools offered
        hermes(NOOP_CALL) + '{"n": 3}',  # calls or the answer, not both
        '{"n":' + " " * 2 + "3}",  # at most one whitespace character in a place
    )
    for text in wrong:
        assert not accepts(compiler, constraint, text), text


def test_without_parallel_calls_the_union_takes_one(compiler: StructuredCompiler) -> None:
    constraint = union("hermes", response_format=FORMAT, parallel_tool_calls=False)
    assert constraint is not None
    assert accepts(compiler, constraint, hermes(NOOP_CALL))
    assert not accepts(compiler, constraint, hermes(NOOP_CALL, NOOP_CALL))


@pytest.mark.parametrize("parallel", [True, False])
def test_json_union_writes_calls_as_the_json_parser_reads_them(
    compiler: StructuredCompiler, parallel: bool
) -> None:
    constraint = union(
        "json", response_format={"type": "json_object"}, parallel_tool_calls=parallel
    )
    assert constraint is not None
    calls = f"[{NOOP_CALL}, {WEATHER_CALL}]" if parallel else WEATHER_CALL
    assert accepts(compiler, constraint, calls)
    assert accepts(compiler, constraint, '{"anything": [1, 2]}')  # json_object: any object
    names = [c.name for c in tool_parser("json").parse(calls)[1]]
    assert names == (["noop", "get_weather"] if parallel else ["get_weather"])


@pytest.mark.parametrize(
    "fields",
    [
        {"response_format": FORMAT, "tool_choice": "required"},  # forced: the call's own schema
        {"response_format": FORMAT, "tool_choice": "none"},
        {"structured_outputs": {"json": ANSWER}},  # vLLM's fields constrain the whole output
        {"structured_outputs": {"regex": "[a-z]+"}},
    ],
)
def test_only_auto_beside_a_json_response_format_gets_the_union(fields: dict[str, Any]) -> None:
    request = chat(tools=TOOLS, **fields).generation()
    answer = request.sampling.constraint
    assert answer is not None and request.tools.specs
    assert answer_or_calls(request.tools.specs, request.tools.mode, answer, "hermes") is None


def test_a_parser_whose_syntax_is_unknown_keeps_the_format() -> None:
    assert union("pythonic", response_format=FORMAT) is None
