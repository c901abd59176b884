"""Structured outputs: OpenAI's ``response_format`` and vLLM's extensions as one constraint.

A request may constrain its output in several spellings: OpenAI's ``response_format``
(``json_object``, ``json_schema``), vLLM's ``structured_outputs`` object (``json``, ``regex``,
``choice``, ``grammar``, ``json_object``) and vLLM's older top-level ``guided_json``,
``guided_regex``, ``guided_choice`` and ``guided_grammar``. Each becomes one
:class:`Constraint`, which travels on the wire as the ``SamplingParams`` constraint oneof
(docs/pd-contract.md §20). At most one may be given. What the gateway can check without the
model's vocabulary it checks here, before anything is sent: a JSON schema against the JSON
Schema meta-schema, a regex with Python's ``re``, a choice list's shape. A grammar (and a
schema feature the worker's grammar engine lacks) is checked by the worker, whose refusal
comes back as ``invalid_structured_output`` with the same ``param``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import jsonschema_rs

from tandem.errors import TandemError, make_error
from tandem.gateway.pipeline.generation_request import Constraint, ConstraintKind
from tandem.gateway.tokenizing import more_text_than

# structured_outputs keys that carry the constraint itself, and what they become.
_STRUCTURED_KINDS: dict[str, ConstraintKind] = {
    "json": "json_schema",
    "regex": "regex",
    "choice": "choice",
    "grammar": "grammar",
    "json_object": "json_object",
}
_GUIDED_KINDS: dict[str, ConstraintKind] = {
    "guided_json": "json_schema",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}
# Fields of the request that can carry a constraint (for the request models to declare).
CONSTRAINT_FIELDS = ("response_format", "structured_outputs", *_GUIDED_KINDS)
MAX_CHOICES = 1024
# One constraint's text (a schema's characters and values, a grammar, a regex, the choices),
# at most. Checking a schema holds the GIL for about 70 ms a MiB (jsonschema_rs, then
# json.dumps), and compiling it on a worker costs far more; OpenAI's own limits are far
# lower (docs/operations.md, "Limits").
MAX_CONSTRAINT_CHARS = 512 * 1024


def _invalid(message: str, param: str) -> TandemError:
    return make_error("invalid_structured_output", message, param=param)


def _bad_shape(message: str, param: str) -> TandemError:
    return make_error("invalid_request", message, param=param)


def _unsupported(message: str, param: str) -> TandemError:
    return make_error("unsupported_parameter", message, param=param)


def _given(value: Any) -> bool:
    return value is not None and value is not False


def request_constraint(fields: Mapping[str, Any]) -> Constraint | None:
    """The one constraint among ``fields`` (the request's constraint fields), or None.

    Raises 400: two constraints; a malformed one (``invalid_request``); a JSON schema or
    regex that cannot constrain anything (``invalid_structured_output``); an option Tandem
    cannot honour (``unsupported_parameter``).
    """
    found: list[Constraint] = []
    if (fmt := fields.get("response_format")) is not None:
        found.extend(_from_response_format(fmt))
    if (structured := fields.get("structured_outputs")) is not None:
        found.extend(_from_structured_outputs(structured))
    for name, kind in _GUIDED_KINDS.items():
        if _given(value := fields.get(name)):
            found.append(_build(kind, value, name))
    if len(found) > 1:
        first, second = found[0].param, found[1].param
        raise _bad_shape(
            f"only one output constraint may be given, got '{first}' and '{second}'", second
        )
    return found[0] if found else None


def _from_response_format(fmt: Any) -> list[Constraint]:
    param = "response_format"
    if not isinstance(fmt, Mapping):
        raise _bad_shape("response_format must be an object with a 'type'", param)
    kind = fmt.get("type")
    if kind == "text":
        return []
    if kind == "json_object":
        return [Constraint("json_object", None, param)]
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, Mapping):
            raise _bad_shape(
                "response_format.json_schema must be an object with a 'schema'",
                "response_format.json_schema",
            )
        if "schema" not in spec or spec["schema"] is None:
            raise _bad_shape(
                "response_format.json_schema.schema is required",
                "response_format.json_schema.schema",
            )
        return [_build("json_schema", spec["schema"], "response_format.json_schema.schema")]
    if kind == "structural_tag":
        raise _unsupported(
            "response_format type 'structural_tag' is not supported yet: remove it", param
        )
    raise _bad_shape(
        f"response_format.type must be 'text', 'json_object' or 'json_schema', got {kind!r}",
        "response_format.type",
    )


def _from_structured_outputs(structured: Any) -> list[Constraint]:
    if not isinstance(structured, Mapping):
        raise _bad_shape("structured_outputs must be an object", "structured_outputs")
    found = []
    for key, value in structured.items():
        param = f"structured_outputs.{key}"
        if key in _STRUCTURED_KINDS:
            if _given(value):
                found.append(_build(_STRUCTURED_KINDS[key], value, param))
        elif _given(value) and value not in ("", [], {}):
            # backend, whitespace options, structural_tag…: each would change the answer.
            raise _unsupported(f"structured_outputs option '{key}' is not supported", param)
    return found


def _build(kind: ConstraintKind, value: Any, param: str) -> Constraint:
    if kind == "json_schema":
        return Constraint(kind, _schema_text(value, param), param)
    if kind == "json_object":
        if value is not True:
            raise _bad_shape(f"{param} must be true or false", param)
        return Constraint(kind, None, param)
    if kind == "choice":
        return Constraint(kind, _choices(value, param), param)
    if not isinstance(value, str) or not value:
        raise _bad_shape(f"{param} must be a non-empty string", param)
    check_constraint_size(value, param)
    if kind == "regex":
        try:
            re.compile(value)
        except re.error as exc:
            raise _invalid(f"{param} is not a valid regular expression: {exc}", param) from None
    return Constraint(kind, value, param)


def _schema_text(value: Any, param: str) -> str:
    """The schema as compact JSON text, after checking it is a JSON Schema at all."""
    schema = value
    too_deep = _invalid(f"{param} is nested too deeply to be a JSON schema", param)
    if isinstance(value, str):  # guided_json (and structured_outputs.json) may be JSON text
        check_constraint_size(value, param)
        try:
            schema = json.loads(value)
        except json.JSONDecodeError as exc:
            raise _invalid(f"{param} is not valid JSON: {exc}", param) from None
        except RecursionError:  # a string of ~1000 nested arrays: parsing it overflows
            raise too_deep from None
    if not isinstance(schema, dict | bool):
        raise _bad_shape(f"{param} must be a JSON schema object", param)
    check_constraint_size(schema, param)
    try:
        jsonschema_rs.validator_for(schema)
        return json.dumps(schema, ensure_ascii=False, separators=(",", ":"))
    except (jsonschema_rs.ValidationError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise _invalid(f"{param} is not a valid JSON schema: {first}", param) from None
    except RecursionError:
        raise too_deep from None


def check_constraint_size(value: Any, param: str) -> None:
    """400 naming ``param`` for a constraint over :data:`MAX_CONSTRAINT_CHARS`, found before
    anything walks all of it (the count stops at the limit)."""
    if more_text_than([value], MAX_CONSTRAINT_CHARS):
        raise _invalid(
            f"{param} is too large: at most {MAX_CONSTRAINT_CHARS} characters and values "
            "are accepted in one output constraint",
            param,
        )


def _choices(value: Any, param: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise _bad_shape(f"{param} must be a non-empty list of strings", param)
    if len(value) > MAX_CHOICES:
        raise _bad_shape(f"{param} takes at most {MAX_CHOICES} choices", param)
    if not all(isinstance(c, str) and c for c in value):
        raise _bad_shape(f"{param} must hold non-empty strings only", param)
    check_constraint_size(value, param)
    return tuple(value)
