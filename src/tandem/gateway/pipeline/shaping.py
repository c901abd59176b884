"""Stage helper: a choice's text → reasoning, content and tool calls, by the gateway's parsers.

The parsing is the gateway's, so every worker (Tandem's or vLLM's) gets the same behaviour.
A reasoning parser (``--reasoning-parser``) splits the thought off first; the tool-call
parser then reads what remains. Which tool parser depends on ``tool_choice``: ``auto`` uses
``--tool-call-parser`` (or the chat template's format), a forced choice reads the JSON its
constraint produced (``gateway/api/tools.py``). A request held to JSON (a forced call,
``response_format``, a JSON schema) skips the reasoning parser, since its constraint starts
at the first token. Malformed output degrades to content.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tandem.errors import make_error
from tandem.gateway.api.schemas import ChatCompletionRequest
from tandem.gateway.config import GatewayConfig
from tandem.gateway.context import RequestContext
from tandem.gateway.reasoning import ReasoningParser, reasoning_parser
from tandem.gateway.tools import (
    NamedStreamer,
    RequiredStreamer,
    ToolStreamer,
    parse_named,
    parse_required,
    tool_parser,
)
from tandem.gateway.tools.calls import (
    ArgumentsPiece,
    CallStart,
    ContentPiece,
    Event,
    ReasoningPiece,
    ToolCall,
)


@dataclass(slots=True)
class Shaped:
    """A finished choice's message parts."""

    content: str | None
    reasoning: str | None = None
    calls: list[ToolCall] = field(default_factory=list)


class ChoiceStreamer:
    """One choice's streamed text through the reasoning parser, then the tool parser."""

    def __init__(self, plan: ShapingPlan) -> None:
        self._reasoning = plan.reasoning.streamer() if plan.reasoning else None
        self._tools = plan.new_tool_streamer() if plan.new_tool_streamer else None
        self._single = plan.single_call
        self._plan = plan
        self._started = False
        self.called = False

    def finish_reason(self, reason: str) -> str:
        return self._plan.finish_reason(reason, self.called)

    def push(self, text: str) -> list[Event]:
        if self._reasoning is None:
            return self._to_tools([ContentPiece(text)] if text else [])
        return self._to_tools(self._reasoning.push(text))

    def finish(self, cut: bool = False) -> list[Event]:
        """``cut``: the token limit ended the choice (a forced call keeps what it wrote)."""
        events = self._to_tools(self._reasoning.finish()) if self._reasoning else []
        if isinstance(self._tools, NamedStreamer | RequiredStreamer):
            events += self._tools.finish(cut)
        elif self._tools is not None:
            events += self._only_first(self._tools.finish())
        self._note(events)
        return events

    def _only_first(self, events: list[Event]) -> list[Event]:
        if not self._single:
            return events
        return [e for e in events if not isinstance(e, CallStart | ArgumentsPiece) or e.index == 0]

    def _to_tools(self, events: Sequence[Event]) -> list[Event]:
        if self._tools is None:
            return list(events)
        out: list[Event] = []
        for event in events:
            if isinstance(event, ContentPiece):
                out += self._only_first(self._tools.push(event.text))
            else:
                out.append(event)
        self._note(out)
        return out

    def _note(self, events: list[Event]) -> None:
        started = any(not isinstance(e, ContentPiece | ReasoningPiece) for e in events)
        self._started = self._started or started
        # A call that broke after its start was streamed ends as content: no "tool_calls".
        self.called = self._started and not (self._tools is not None and self._tools.degraded)


@dataclass(slots=True)
class ShapingPlan:
    """What one request's choices go through; built once per request."""

    reasoning: ReasoningParser | None
    parse_tools: Callable[[str], tuple[str, list[ToolCall]]] | None
    new_tool_streamer: Callable[[], ToolStreamer] | None
    # parallel_tool_calls: false under tool_choice auto: the first call only.
    single_call: bool = False
    # A named tool_choice: the client chose the call, so the choice ends "stop" (as OpenAI's
    # and vLLM's do), not "tool_calls".
    named: bool = False
    # How a cut-off answer is read, where that differs (a forced call keeps its partial args).
    parse_cut: Callable[[str], tuple[str, list[ToolCall]]] | None = None
    # tool_choice auto: the parser reading the calls (its call syntax, tools/union.py).
    tool_format: str | None = None

    def finish_reason(self, reason: str, called: bool) -> str:
        """A choice that ended by itself with calls ends for them (but under a named
        tool_choice); a cut-off one stays "length"."""
        return "tool_calls" if called and reason == "stop" and not self.named else reason

    def whole(self, text: str, cut: bool = False) -> Shaped:
        """``cut``: the token limit ended the choice (a forced call keeps what it wrote)."""
        reasoning = None
        if self.reasoning is not None:
            reasoning, text = self.reasoning.parse(text)
        if self.parse_tools is None:
            return Shaped(text, reasoning)
        parse = self.parse_cut if cut and self.parse_cut is not None else self.parse_tools
        content, calls = parse(text)
        if self.single_call:
            calls = calls[:1]
        # With calls, OpenAI's message has no content unless the model wrote some.
        return Shaped(content if content or not calls else None, reasoning, calls)

    def streamer(self) -> ChoiceStreamer:
        return ChoiceStreamer(self)


def shaping_plan(ctx: RequestContext, config: GatewayConfig) -> ShapingPlan | None:
    """None for a plain text answer (completions; chat without tools or reasoning parser).

    Built before anything is sent: ``tool_choice: auto`` without a parser is a 400 then.
    """
    body = ctx.body
    if not isinstance(body, ChatCompletionRequest):
        return None
    mode = body.tool_mode
    # A JSON constraint (response_format, structured_outputs.json, guided_json) holds
    # decoding to JSON from the first token, so the model never writes its reasoning
    # markers: the whole answer is content, as for a forced call. Parsing it for reasoning
    # once returned the JSON as reasoning_content and an empty answer. A regex, grammar or
    # choice may spell the markers out itself, so its answer is still parsed.
    constraint = body.constraint
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
