"""Constraints before compilation: choice escaping, Lark detection, schema checks, messages.

The choice grammars are compiled by the real xgrammar against the built-in vocabulary and
walked byte by byte, so an escaping mistake shows as a string the grammar refuses (or one
it accepts that is not a choice).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tandem.engine.refusals import RefusedField
from tandem.engine.structured import StructuredCompiler, readable
from tandem.engine.structured_spec import (
    Constraint,
    StructuredOutputError,
    looks_like_lark,
    unenforceable_keyword,
)
from tandem.wire.ebnf import choice_grammar

STOP = 258  # tiny-qwen3-vl's <|im_end|>


@pytest.fixture(scope="module")
def compiler(builtin_dirs: dict[str, Path]) -> StructuredCompiler:
    return StructuredCompiler(builtin_dirs["tiny-qwen3-vl"], 263)


def accepts(compiler: StructuredCompiler, constraint: Constraint, text: str) -> bool:
    """Whether a fresh matcher takes ``text`` (byte ids) and then ends on the stop token."""
    matcher = compiler.compile(constraint, [STOP]).matcher()
    for token in [*text.encode(), STOP]:
        if not matcher.accept(token):
            return False
    return matcher.terminated


TRICKY = ('say "hi"', "back\\slash", "two\nlines\r\n", "tab\there", "bell\x07del\x7f", "é☃", "")


def test_choice_escaping_keeps_every_string_exact(compiler: StructuredCompiler) -> None:
    choice = Constraint("choice", choices=TRICKY)
    for text in TRICKY:
        assert accepts(compiler, choice, text), repr(text)
    for wrong in ('say \\"hi\\"', "back\\\\slash", "two\\nlines", "tab", "é", "x"):
        assert not accepts(compiler, choice, wrong), repr(wrong)


def test_choice_grammar_is_one_alternation() -> None:
    assert choice_grammar(["a", 'b"']) == 'root ::= "a" | "b\\""'


@pytest.mark.parametrize(
    ("choices", "needle"),
    [((), "at least one"), (("a\x00b",), "NUL")],
)
def test_unusable_choices_are_refused(choices: tuple[str, ...], needle: str) -> None:
    with pytest.raises(StructuredOutputError, match=needle):
        Constraint("choice", choices=choices).check()


@pytest.mark.parametrize(
    ("grammar", "lark"),
    [
        ('root ::= "a"', False),
        ('# a comment: with a colon\nroot ::= "a" | "b"', False),
        ('start: "yes" | "no"', True),
        ('start: "x" // not ::= here\n', True),
        ("", True),
    ],
)
def test_lark_is_told_from_ebnf(grammar: str, lark: bool) -> None:
    assert looks_like_lark(grammar) is lark


def test_lark_and_ebnf_grammars_both_compile(compiler: StructuredCompiler) -> None:
    assert accepts(compiler, Constraint("grammar", 'start: "yes" | "no"'), "no")
    assert accepts(compiler, Constraint("grammar", 'root ::= "yes" | "no"'), "yes")
    assert not accepts(compiler, Constraint("grammar", 'root ::= "yes" | "no"'), "maybe")


def test_structural_tags_in_both_forms(compiler: StructuredCompiler) -> None:
    const = {"type": "structural_tag", "format": {"type": "const_string", "value": "hi"}}
    assert accepts(compiler, Constraint("structural_tag", json.dumps(const)), "hi")
    assert not accepts(compiler, Constraint("structural_tag", json.dumps(const)), "ho")
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    legacy = {
        "structures": [{"begin": "<f>", "schema": schema, "end": "</f>"}],
        "triggers": ["<f>"],
    }
    tagged = Constraint("structural_tag", json.dumps(legacy))
    assert accepts(compiler, tagged, 'free text <f>{"a": 1}</f> more')
    assert not accepts(compiler, tagged, '<f>{"b": 1}</f>')


def _nested(depth: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


@pytest.mark.parametrize(
    ("schema", "needle"),
    [
        ({"type": "integer", "multipleOf": 3}, "multipleOf"),
        ({"type": "array", "uniqueItems": True}, "uniqueItems"),
        ({"type": "string", "format": "credit-card"}, "format 'credit-card'"),
        ({"type": "string", "pattern": "a+", "maxLength": 3}, "minLength/maxLength"),
        ({"allOf": [{"type": "string"}, {"enum": ["a"]}]}, "allOf"),
        (
            {"type": "object", "properties": {"x": {"type": "number", "multipleOf": 2}}},
            "multipleOf",
        ),
        (
            {"type": "object", "patternProperties": {"a": {}, "b": {}}},
            "more than one patternProperties",
        ),
        ({"type": "object", "propertyNames": {"pattern": "a"}, "properties": {}}, "properties"),
    ],
)
def test_unenforceable_schema_keywords_are_refused(schema: dict, needle: str) -> None:
    with pytest.raises(StructuredOutputError, match=needle) as info:
        Constraint("json_schema", json.dumps(schema)).check()
    assert info.value.code == "invalid_structured_output"
    assert isinstance(info.value, RefusedField | ValueError)


def test_enforceable_schemas_pass() -> None:
    schema = {
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "blue"]},
            "n": {"type": "integer", "minimum": 1, "maximum": 5},
            "name": {"type": "string", "maxLength": 8},
            "when": {"type": "string", "format": "date"},
        },
        "required": ["color", "n"],
        "additionalProperties": False,
    }
    assert unenforceable_keyword(schema) is None
    Constraint("json_schema", json.dumps(schema)).check()
    assert unenforceable_keyword(_nested(40)) is None


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("", "empty"),
        ("  ", "empty"),
        ("{not json", "not valid JSON"),
        (json.dumps(_nested(70)), "nested too deeply"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ],
)
def test_malformed_schemas_are_refused_before_compiling(spec: str, needle: str) -> None:
    with pytest.raises(StructuredOutputError, match=needle):
        Constraint("json_schema", spec).check()


def test_regex_with_nul_is_refused() -> None:
    with pytest.raises(StructuredOutputError, match="NUL"):
        Constraint("regex", "a\x00b").check()


@pytest.mark.parametrize(
    ("constraint", "needle"),
    [
        (Constraint("json_schema", '{"type": 5}'), "json_schema: Type should be a string"),
        (Constraint("regex", "(a"), "regex: Regex parsing error at position 3"),
        (Constraint("grammar", "root ::= foo"), "grammar: EBNF parser error at line 1, column"),
        (Constraint("grammar", "start: bar"), "grammar:"),
        (Constraint("structural_tag", '{"type": "nope"}'), "structural_tag:"),
        (Constraint("structural_tag", '{"structures": [{}], "triggers": []}'), "begin, schema"),
    ],
)
def test_compile_errors_are_readable(
    compiler: StructuredCompiler, constraint: Constraint, needle: str
) -> None:
    with pytest.raises(StructuredOutputError) as info:
        compiler.compile(constraint, [STOP])
    message = str(info.value)
    assert needle in message
    # No C++ source locations or check expressions reach the client.
    assert ".cc:" not in message and "Check failed" not in message
    assert info.value.code == "invalid_structured_output"


def test_readable_strips_native_noise() -> None:
    raw = RuntimeError(
        "[11:26:29] /project/cpp/json_schema_converter.cc:4939: Check failed: "
        "(error.empty()) is false: Failed to parse JSON: syntax error\n"
    )
    assert readable(raw) == "Failed to parse JSON: syntax error"


@pytest.mark.parametrize("any_whitespace", [False, True])
def test_json_grammars_are_compact_unless_any_whitespace_is_asked(
    builtin_dirs: dict[str, Path], any_whitespace: bool
) -> None:
    """Compact is vLLM's disable_any_whitespace: one space after ',' and ':', no other; with
    any whitespace (vLLM's default) a model may pad a document until max_tokens."""
    compiler = StructuredCompiler(builtin_dirs["tiny-qwen3-vl"], 263, any_whitespace=any_whitespace)
    schema = Constraint("json_schema", json.dumps({"type": "object", "properties": {"a": {}}}))
    for kind in (schema, Constraint("json_object")):
        assert accepts(compiler, kind, '{"a": 1}')
        for padded in ('{ "a": 1}', '{"a":  1}', '{"a": 1\n}'):
            assert accepts(compiler, kind, padded) is any_whitespace, padded
