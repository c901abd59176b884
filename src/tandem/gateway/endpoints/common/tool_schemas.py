"""Tool definitions and ``tool_choice``: what the template is given and what decoding is held to.

``tool_choice`` decides both (OpenAI's semantics):

- ``none``: the tools are left out of the prompt, and no call is parsed;
- ``auto`` (the default when tools are given): the template lists the tools, decoding is
  free, and the tool-call parser extracts any calls the model makes;
- ``required`` and a named function: decoding is constrained by a JSON schema built from
  the tool definitions, as vLLM's server does, so the answer is a call whatever the model:
  ``required`` gives an array of ``{"name", "parameters"}`` objects (one at most with
  ``parallel_tool_calls: false``), a named function gives that function's arguments object.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

import jsonschema_rs
from pydantic import BaseModel, Discriminator, Field, Tag

from tandem.errors import TandemError, make_error
from tandem.gateway.endpoints.common.messages import INVALID, STRICT_IGNORE_EXTRA
from tandem.gateway.endpoints.common.schema_defs import hoist_definitions
from tandem.gateway.endpoints.common.structured import check_constraint_size
from tandem.gateway.pipeline.generation_request import Constraint, ToolMode

MAX_TOOLS = 128
# Arguments of a function that declares no parameters: an empty object, nothing else.
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


class FunctionDefinition(BaseModel):
    model_config = STRICT_IGNORE_EXTRA

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(BaseModel):
    model_config = STRICT_IGNORE_EXTRA

    type: Literal["function"]
    function: FunctionDefinition


class _ChosenFunction(BaseModel):
    model_config = STRICT_IGNORE_EXTRA

    name: str


class NamedToolChoice(BaseModel):
    model_config = STRICT_IGNORE_EXTRA

    type: Literal["function"]
    function: _ChosenFunction


def _choice_tag(value: Any) -> str | None:
    if isinstance(value, str):
        return "~mode"
    return "~named" if isinstance(value, dict | NamedToolChoice) else None


# Tagged: tags start with "~" and drop out of error locations (validation_errors.py).
ToolChoice = Annotated[
    Annotated[Literal["none", "auto", "required"], Tag("~mode")]
    | Annotated[NamedToolChoice, Tag("~named")],
    Discriminator(
        _choice_tag,
        custom_error_type=INVALID,
        custom_error_message=(
            "tool_choice must be 'none', 'auto', 'required' or {'type': 'function', "
            "'function': {'name': ...}}"
        ),
    ),
]


def tool_mode(tools: list[Tool] | None, choice: ToolChoice | None, parallel: bool) -> ToolMode:
    """The request's tool mode; 400 for a choice its tools cannot satisfy."""
    if not tools:
        if choice is not None and choice != "none":
            raise _bad("tool_choice needs tools", "tool_choice")
        return ToolMode("none")
    names = [t.function.name for t in tools]
    if len(set(names)) != len(names):
        raise _bad("tool names must be unique", "tools")
    for i, tool in enumerate(tools):
        _check_parameters(tool, f"tools.{i}.function.parameters")
    if choice is None or choice == "auto":
        return ToolMode("auto", parallel=parallel)
    if choice == "none":
        return ToolMode("none")
    if choice == "required":
        return ToolMode("required", parallel=parallel)
    assert isinstance(choice, NamedToolChoice)
    if choice.function.name not in names:
        raise _bad(
            f"tool_choice names '{choice.function.name}', which is not among the tools",
            "tool_choice.function.name",
        )
    return ToolMode("named", choice.function.name, parallel)


def tool_constraint(tools: list[Tool], mode: ToolMode) -> Constraint | None:
    """The JSON schema that makes the answer a call (``required`` / named), else None."""
    if mode.kind == "named":
        tool = next(t for t in tools if t.function.name == mode.name)
        return Constraint("json_schema", _compact(_parameters(tool)), "tool_choice")
    if mode.kind != "required":
        return None
    # Each tool's definitions move to the array's root, where its "#/$defs/…" now points.
    parameters, definitions = hoist_definitions([(t.function.name, _parameters(t)) for t in tools])
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": [t.function.name]},
                "parameters": params,
            },
            "required": ["name", "parameters"],
            "additionalProperties": False,
        }
        for t, params in zip(tools, parameters, strict=True)
    ]
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
    if not mode.parallel:
        schema["maxItems"] = 1
    if definitions:
        schema["$defs"] = definitions
    return Constraint("json_schema", _compact(schema), "tool_choice")


def template_tools(tools: list[Tool] | None, mode: ToolMode) -> list[dict[str, Any]] | None:
    """The tools as the chat template takes them (None: leave them out of the prompt)."""
    if not tools or mode.kind == "none":
        return None
    return [t.model_dump(exclude_none=True) for t in tools]


def _check_parameters(tool: Tool, param: str) -> None:
    """A tool's parameters must be a JSON Schema: a forced call is decoded against it."""
    if tool.function.parameters is None:
        return
    check_constraint_size(tool.function.parameters, param)  # before anything walks all of it
    try:
        jsonschema_rs.validator_for(tool.function.parameters)
    except (jsonschema_rs.ValidationError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise make_error(
            "invalid_structured_output", f"{param} is not a valid JSON schema: {first}", param=param
        ) from None


def _parameters(tool: Tool) -> dict[str, Any]:
    return tool.function.parameters or NO_PARAMETERS


def _compact(schema: dict[str, Any]) -> str:
    return json.dumps(schema, ensure_ascii=False, separators=(",", ":"))


def _bad(message: str, param: str) -> TandemError:
    return make_error("invalid_request", message, param=param)
