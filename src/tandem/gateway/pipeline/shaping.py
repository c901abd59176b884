"""Stage helper: a choice's text → reasoning, content and tool calls, by the gateway's parsers.

The parsing is the gateway's, so every worker (Tandem's or vLLM's) gets the same behaviour.
A reasoning parser (``--reasoning-parser``) splits the thought off first; the tool-call
parser then reads what remains. Which tool parser depends on ``tool_choice``: ``auto`` uses
``--tool-call-parser`` (or the chat template's format), a forced choice reads the JSON its
constraint produced (``gateway/endpoints/common/tool_schemas.py``). A request held to JSON
(a forced call, ``response_format``, a JSON schema) skips the reasoning parser, since its
constraint starts at the first token. Malformed output degrades to content.
"""

from __future__ import annotations

from tandem.errors import make_error
from tandem.gateway.config import GatewayConfig
from tandem.gateway.context import RequestContext
from tandem.gateway.pipeline.shaping_plan import ShapingPlan
from tandem.gateway.reasoning import reasoning_parser
from tandem.gateway.tools import (
    NamedStreamer,
    RequiredStreamer,
    parse_named,
    parse_required,
    tool_parser,
)
from tandem.gateway.tools.calls import ToolCall


def shaping_plan(ctx: RequestContext, config: GatewayConfig) -> ShapingPlan | None:
    """None for a plain text answer (completions; chat without tools or reasoning parser).

    Built before anything is sent: ``tool_choice: auto`` without a parser is a 400 then.
    """
    request = ctx.request
    if not request.chat:
        return None
    mode = request.tools.mode
    # A JSON constraint (response_format, structured_outputs.json, guided_json) holds
    # decoding to JSON from the first token, so the model never writes its reasoning
    # markers: the whole answer is content, as for a forced call. Parsing it for reasoning
    # once returned the JSON as reasoning_content and an empty answer. A regex, grammar or
    # choice may spell the markers out itself, so its answer is still parsed.
    constraint = request.sampling.constraint
    json_only = constraint is not None and constraint.kind in ("json_schema", "json_object")
    reasoning = None
    if config.reasoning_parser and not json_only:
        reasoning = reasoning_parser(config.reasoning_parser)
    if mode.kind == "named":
        name = mode.name or ""
        return ShapingPlan(
            None,
            lambda text: _named(name, text),
            lambda: NamedStreamer(name),
            named=True,
            parse_cut=lambda text: _named(name, text, cut=True),
        )
    if mode.kind == "required":
        return ShapingPlan(
            None, _required, RequiredStreamer, parse_cut=lambda text: _required(text, cut=True)
        )
    if mode.kind == "auto":
        name = _auto_parser_name(ctx, config)
        parser = tool_parser(name)
        return ShapingPlan(
            reasoning, parser.parse, parser.streamer, not mode.parallel, tool_format=name
        )
    return ShapingPlan(reasoning, None, None) if reasoning else None


def _auto_parser_name(ctx: RequestContext, config: GatewayConfig) -> str:
    name = config.tool_call_parser or ctx.model.template.tool_call_format
    if name is None:
        raise make_error(
            "unsupported_parameter",
            "tool_choice 'auto' needs a tool-call parser: start the gateway with "
            "--tool-call-parser, or name a function in tool_choice",
            param="tool_choice",
        )
    return name


def _required(text: str, cut: bool = False) -> tuple[str, list[ToolCall]]:
    calls = parse_required(text, cut)
    return ("" if calls else text), calls


def _named(name: str, text: str, cut: bool = False) -> tuple[str, list[ToolCall]]:
    call = parse_named(name, text, cut)
    return ("", [call]) if call is not None else (text, [])
