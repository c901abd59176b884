"""``tool_choice: "auto"`` with a ``response_format``: a call *or* the formatted answer.

OpenAI's ``response_format`` governs the model's text answer; with tools offered and the
choice left to the model, the answer may also be a call. Constraining the whole output to
the format (vLLM's behaviour) makes a call impossible, so agents that combine tools with an
output type never get one. Here the output is held to one grammar over both: either the
tool calls, written in the model's own call syntax (the one ``--tool-call-parser`` reads, so
the answer is parsed exactly as an unconstrained one), or a document of the format.

The grammar is an xgrammar structural tag (the wire's ``structural_tag`` constraint,
docs/pd-contract.md §20): an ``or`` of the calls and the format's JSON schema. Each call is
a tag whose fixed text carries the function's name, whose content is that function's own
parameter schema (its ``$defs`` stay at its root), and whose end closes the call. JSON in a
structural tag may hold whitespace between tokens; it is capped at one character per place
(``max_whitespace_cnt``), so a model can neither pad forever nor be stopped from writing the
spaces the call syntax itself uses.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from tandem.gateway.context import RequestContext
from tandem.gateway.pipeline.generation_request import Constraint, ToolMode, ToolSpec

# Each parser's call syntax: the text before the arguments object (with the name), the text
# after it, and what separates two calls. Hermes is Qwen's ``<tool_call>`` block, as the
# built-in templates write it (models/templates.py); ``json`` a bare call object, several in
# an array.
_HERMES = ('<tool_call>\n{{"name": {name}, "arguments": ', "}\n</tool_call>", "\n")
_JSON = ('{{"name": {name}, "arguments": ', "}", ", ")
_SYNTAX = {"hermes": _HERMES, "qwen": _HERMES, "json": _JSON}
# Whitespace characters JSON may hold in one place (xgrammar needs at least 1).
MAX_WHITESPACE = 1


def answer_or_calls(
    tools: tuple[ToolSpec, ...], mode: ToolMode, answer: Constraint, parser: str
) -> Constraint | None:
    """The union constraint for ``auto`` tools beside a response-format ``answer``; None when
    ``answer`` is not a JSON format or the parser's call syntax is not known here (the
    answer's own constraint then stays, as before)."""
    if mode.kind != "auto" or not answer.param.startswith("response_format"):
        return None
    if answer.kind not in ("json_schema", "json_object") or parser not in _SYNTAX:
        return None
    schema: Any = {"type": "object"}  # json_object
    if answer.kind == "json_schema" and isinstance(answer.value, str):
        schema = json.loads(answer.value)
    begin, end, separator = _SYNTAX[parser]
    tags = [
        {
            "type": "tag",
            "begin": begin.format(name=json.dumps(t.name)),
            "content": _json_format(t.parameters),
            "end": end,
        }
        for t in tools
    ]
    calls: dict[str, Any] = {
        "type": "tags_with_separator",
        "tags": tags,
        "separator": separator,
        "at_least_one": True,
        "stop_after_first": not mode.parallel,
    }
    if parser == "json" and mode.parallel:
        # Several bare calls only parse as an array (tools/json_format.py).
        calls = {
            "type": "sequence",
            "elements": [_const("["), calls, _const("]")],
        }
    tag = {
        "type": "structural_tag",
        "format": {"type": "or", "elements": [calls, _json_format(schema)]},
    }
    text = json.dumps(tag, ensure_ascii=False, separators=(",", ":"))
    return Constraint("structural_tag", text, answer.param)


def _json_format(schema: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": schema, "max_whitespace_cnt": MAX_WHITESPACE}


def _const(text: str) -> dict[str, str]:
    return {"type": "const_string", "value": text}


def with_answer_or_calls(ctx: RequestContext) -> None:
    """Put the union on ``ctx``'s request when it asks for one (before the worker protocol's
    request is built): chat with ``tool_choice: auto`` and a JSON ``response_format``."""
    request, plan = ctx.request, ctx.shaping
    if not request.chat or plan is None or plan.tool_format is None:
        return
    answer = request.sampling.constraint
    if answer is None or not request.tools.specs:
        return
    union = answer_or_calls(request.tools.specs, request.tools.mode, answer, plan.tool_format)
    if union is not None:
        sampling = replace(request.sampling, constraint=union)
        ctx.request = replace(request, sampling=sampling)
