"""Structured-output constraints as the engine takes them, checked before any compilation.

A :class:`Constraint` is the wire's ``SamplingParams.constraint`` oneof in engine terms
(one kind, one spec). The checks here refuse, with a message a person can act on, what
xgrammar would mis-handle or silently ignore: a JSON schema nested deeper than its native
converter should walk, schema keywords it cannot enforce, a NUL in a regex or a choice.
They need no xgrammar; :mod:`tandem.engine.structured` compiles what passes them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from tandem.engine.refusals import RefusedField

ConstraintKind = Literal[
    "json_schema", "regex", "grammar", "structural_tag", "json_object", "choice"
]

# Objects and arrays nested deeper than this are refused before any native code walks them;
# a structural tag wraps its schemas in a few more levels of its own.
MAX_SCHEMA_NESTING = 64
MAX_STRUCTURAL_TAG_NESTING = MAX_SCHEMA_NESTING + 16

# String formats xgrammar's JSON schema converter turns into a grammar; any other format
# would be accepted and then not enforced.
XGRAMMAR_STRING_FORMATS = frozenset(
    {
        "date",
        "date-time",
        "duration",
        "email",
        "hostname",
        "ipv4",
        "ipv6",
        "json-pointer",
        "relative-json-pointer",
        "time",
        "uri",
        "uri-reference",
        "uri-template",
        "uuid",
    }
)


class StructuredOutputError(RefusedField):
    """A constraint that cannot steer decoding (bad schema, regex, grammar or choice list)."""

    def __init__(self, message: str, code: str = "invalid_structured_output") -> None:
        super().__init__(message, code)


@dataclass(frozen=True, slots=True)
class Constraint:
    """One structured-output constraint: ``spec`` is the schema, regex, grammar or tag text.

    ``json_object`` has no spec (any JSON object); ``choice`` keeps its strings in
    ``choices``.
    """

    kind: ConstraintKind
    spec: str = ""
    choices: tuple[str, ...] = ()

    def check(self) -> None:
        """Refuse what no compilation should be tried on (StructuredOutputError)."""
        if self.kind == "json_schema":
            check_json_schema(self.spec)
        elif self.kind == "structural_tag":
            _parse_json(self.spec, "structural_tag", MAX_STRUCTURAL_TAG_NESTING)
        elif self.kind == "regex":
            if "\x00" in self.spec:
                raise StructuredOutputError("regex must not contain a NUL character")
        elif self.kind == "grammar":
            if not self.spec.strip():
                raise StructuredOutputError("grammar is empty")
        elif self.kind == "choice":
            if not self.choices:
                raise StructuredOutputError("choice needs at least one string")
            if any("\x00" in c for c in self.choices):
                # xgrammar's EBNF literals end at a NUL: the choice would be cut short.
                raise StructuredOutputError("choice strings must not contain a NUL character")


_COMMENT = re.compile(r"(#|//).*$")


def looks_like_lark(grammar: str) -> bool:
    """True unless some line (comments aside) defines a rule with EBNF's ``::=``.

    Lark writes ``rule: ...``; GBNF/EBNF writes ``rule ::= ...``. A grammar with no rule
    line of either kind is read as Lark, as vLLM reads it.
    """
    return not any("::=" in _COMMENT.sub("", line) for line in grammar.splitlines())


def check_json_schema(spec: str) -> Any:
    """The parsed schema, or StructuredOutputError naming what is wrong with it."""
    schema = _parse_json(spec, "json_schema", MAX_SCHEMA_NESTING)
    problem = unenforceable_keyword(schema)
    if problem:
        raise StructuredOutputError(
            f"json_schema uses {problem}, which constrained decoding cannot enforce"
        )
    return schema


def _parse_json(spec: str, name: str, max_nesting: int) -> Any:
    if not spec.strip():
        raise StructuredOutputError(f"{name} is empty")
    try:
        value = json.loads(spec)
    except RecursionError:
        raise StructuredOutputError(f"{name} is nested too deeply") from None
    except ValueError as exc:
        raise StructuredOutputError(f"{name} is not valid JSON: {exc}") from None
    if _depth_exceeds(value, max_nesting):
        raise StructuredOutputError(
            f"{name} is nested too deeply: objects and arrays may nest at most {max_nesting} levels"
        )
    return value


def _depth_exceeds(value: Any, limit: int) -> bool:
    # Breadth first, one level a turn: no recursion, so a hostile document cannot overflow.
    level = [value]
    for _ in range(limit):
        level = [
            child
            for node in level
            if isinstance(node, dict | list)
            for child in (node.values() if isinstance(node, dict) else node)
            if isinstance(child, dict | list)
        ]
        if not level:
            return False
    return True


def _types(schema: dict[str, Any]) -> set[str]:
    declared = schema.get("type")
    if isinstance(declared, str):
        return {declared}
    if isinstance(declared, list):
        return {t for t in declared if isinstance(t, str)}
    return set()


def _bounded_pattern(schema: dict[str, Any]) -> bool:
    return ("pattern" in schema or "format" in schema) and (
        "minLength" in schema or "maxLength" in schema
    )


def _own_problem(schema: dict[str, Any]) -> str | None:
    """The first keyword of this one subschema that xgrammar would not enforce."""
    types = _types(schema)
    if types & {"integer", "number"} and "multipleOf" in schema:
        return "multipleOf"
    if "array" in types:
        for key in ("uniqueItems", "contains", "minContains", "maxContains"):
            if key in schema:
                return f"{key} on an array"
    if "string" in types:
        fmt = schema.get("format")
        if fmt is not None and fmt not in XGRAMMAR_STRING_FORMATS:
            return f"string format {fmt!r}"
        if _bounded_pattern(schema):
            return "a string pattern or format together with minLength/maxLength"
    if "object" in types:
        names = schema.get("propertyNames")
        if names is not None:
            if isinstance(names, dict) and _bounded_pattern(names):
                return "propertyNames with a pattern and a length bound"
            for key in ("patternProperties", "properties"):
                if key in schema:
                    return f"propertyNames together with {key}"
            if schema.get("unevaluatedProperties", True) is not True:
                return "propertyNames together with unevaluatedProperties"
        patterns = schema.get("patternProperties")
        if isinstance(patterns, dict):
            if "properties" in schema:
                return "patternProperties together with properties"
            if len(patterns) > 1:
                return "more than one patternProperties entry"
    all_of = schema.get("allOf")
    if isinstance(all_of, list) and len(all_of) >= 2:
        return "allOf with several branches"
    return None


def unenforceable_keyword(schema: Any) -> str | None:
    """A description of the first keyword anywhere in ``schema`` xgrammar cannot enforce.

    Every nested object is looked at as a subschema (a ``properties`` map too): that can
    only refuse more, never let an unenforced keyword through.
    """
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            problem = _own_problem(node)
            if problem:
                return problem
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return None
