"""A structured-output constraint as the scheduler protocols' ``constraint`` oneof takes it.

SGLang and TokenSpeed name the oneof's members alike (``regex``, ``json_schema``,
``ebnf_grammar``, ``structural_tag``): ``json_object`` becomes the schema of any object, and
a ``choice`` list a grammar whose root is one of the strings, exactly.
"""

from __future__ import annotations

import json

from tandem.errors import make_error
from tandem.wire.ebnf import choice_grammar

# json_object as these engines take it: a JSON schema that admits any object.
ANY_OBJECT_SCHEMA = json.dumps({"type": "object"})


def constraint_field(kind: str, value: str | tuple[str, ...] | None) -> tuple[str, str]:
    """The oneof member to set for a constraint (``Constraint.kind`` and ``.value`` of
    ``pipeline/generation_request.py``) and its value."""
    if kind == "json_object":
        return "json_schema", ANY_OBJECT_SCHEMA
    if kind == "choice":
        assert isinstance(value, tuple)
        if any("\x00" in choice for choice in value):
            # EBNF string literals end at a NUL in the grammar engines these workers use.
            raise make_error("invalid_structured_output", "choice strings may not contain NUL")
        return "ebnf_grammar", choice_grammar(value)
    assert isinstance(value, str)
    if kind == "grammar":
        return "ebnf_grammar", value
    return kind, value  # regex, json_schema, structural_tag: the same names
