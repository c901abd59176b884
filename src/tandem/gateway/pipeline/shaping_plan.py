"""What a request's choices go through once its shaping is decided (``shaping.py``).

The types only: ``RequestContext`` holds a ``ShapingPlan``, and ``shaping.py`` builds one
from the context, so the plan lives apart from its builder (no import circle).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tandem.gateway.reasoning import ReasoningParser
from tandem.gateway.tools import NamedStreamer, RequiredStreamer, ToolStreamer
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
    # tool_choice auto: the parser reading the calls (its call syntax, pipeline/answer_or_calls.py).
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
