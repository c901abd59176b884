"""Definitions (``$defs`` / ``definitions``) of several schemas, hoisted to one root.

``tool_choice: "required"`` nests each tool's parameter schema inside one array schema
(``tool_schemas.py``). A parameter schema that pydantic generated for nested models keeps its
sub-schemas in ``$defs`` and points at them with ``{"$ref": "#/$defs/Name"}``: once nested,
``#/`` is the array's root and every such reference dangles. The definitions are therefore
moved to the new root's ``$defs`` (as vLLM does), and where two tools define the same name
differently, the later one is renamed ``<tool>.<name>`` and its references rewritten
(vLLM refuses that case).
"""

from __future__ import annotations

import copy
from typing import Any

_DEF_KEYS = ("$defs", "definitions")


def hoist_definitions(
    schemas: list[tuple[str, dict[str, Any]]],
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``(tool name, parameter schema)`` pairs → the schemas without their definitions, and
    the definitions they all need, for the root that will hold them."""
    hoisted: dict[str, Any] = {}
    out = []
    for tool, schema in schemas:
        schema = copy.deepcopy(schema)
        local = {
            (key, name): definition
            for key in _DEF_KEYS
            if isinstance(schema.get(key), dict)
            for name, definition in schema.pop(key).items()
        }
        renames: dict[tuple[str, str], str] = {}
        for (key, name), definition in local.items():
            new = name
            if new in hoisted and hoisted[new] != definition:
                new = f"{tool}.{name}"
                while new in hoisted and hoisted[new] != definition:
                    new += "_"
            renames[(key, name)] = new
        for (key, name), definition in local.items():
            hoisted[renames[(key, name)]] = _rewritten(definition, renames)
        out.append(_rewritten(schema, renames))
    return out, hoisted


def _rewritten(node: Any, renames: dict[tuple[str, str], str]) -> Any:
    """``node`` with each local definition reference pointed at the hoisted name."""
    if not renames:
        return node
    if isinstance(node, list):
        return [_rewritten(item, renames) for item in node]
    if not isinstance(node, dict):
        return node
    result = {key: _rewritten(value, renames) for key, value in node.items()}
    ref = node.get("$ref")
    if isinstance(ref, str):
        result["$ref"] = _renamed_ref(ref, renames)
    return result


def _renamed_ref(ref: str, renames: dict[tuple[str, str], str]) -> str:
    for (key, name), new in renames.items():
        old = f"#/{key}/{name}"
        if ref == old or ref.startswith(old + "/"):
            return f"#/$defs/{new}" + ref[len(old) :]
    return ref
