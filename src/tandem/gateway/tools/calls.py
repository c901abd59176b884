"""What the tool-call and reasoning parsers produce: calls, and streaming events.

A parser turns a model's whole output into content plus calls (``parse``); its
streamer turns the same output, fed in pieces, into an ordered list of events per
choice. The events of one output, concatenated per kind, are the same however
the output was split (see ``coalesce``); ``collect`` turns them back into
content and calls.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str  # "call_" + 24 hex digits, new per call
    name: str
    arguments: str  # JSON text of an object, as the model wrote it; "{}" when it gave none


def new_call_id() -> str:
    """An OpenAI-style call id: ``call_`` and 24 random hex digits."""
    return "call_" + secrets.token_hex(12)


@dataclass(frozen=True, slots=True)
class ContentPiece:
    text: str


@dataclass(frozen=True, slots=True)
class ReasoningPiece:
    text: str


@dataclass(frozen=True, slots=True)
class CallStart:
    index: int  # 0, 1, … within the choice
    id: str
    name: str


@dataclass(frozen=True, slots=True)
class ArgumentsPiece:
    index: int  # the CallStart this belongs to
    text: str  # the pieces of one call, concatenated, are its arguments


Event = ContentPiece | ReasoningPiece | CallStart | ArgumentsPiece


class ToolStreamer(Protocol):
    def push(self, text: str) -> list[Event]:
        """The next piece of output → the events it decides (ContentPiece, CallStart,
        ArgumentsPiece); text that may still become part of a call is held back."""
        ...

    def finish(self) -> list[Event]:
        """End of output: decide and release what is held back."""
        ...

    @property
    def degraded(self) -> bool:
        """A call broke after its CallStart went out: the stream then differs from parse()
        (the client has the start and pieces, the rest came as content)."""
        ...


class ToolParser(Protocol):
    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        """Whole output → (content left over, calls). No call found / malformed → (text, [])."""
        ...

    def streamer(self) -> ToolStreamer: ...


def coalesce(events: Iterable[Event]) -> list[Event]:
    """Merge neighbouring pieces of one kind (and one call): the split-independent form."""
    out: list[Event] = []
    for event in events:
        last = out[-1] if out else None
        if isinstance(event, ContentPiece) and isinstance(last, ContentPiece):
            out[-1] = ContentPiece(last.text + event.text)
        elif isinstance(event, ReasoningPiece) and isinstance(last, ReasoningPiece):
            out[-1] = ReasoningPiece(last.text + event.text)
        elif (
            isinstance(event, ArgumentsPiece)
            and isinstance(last, ArgumentsPiece)
            and last.index == event.index
        ):
            out[-1] = ArgumentsPiece(event.index, last.text + event.text)
        elif isinstance(event, CallStart) or event.text:
            out.append(event)  # empty pieces say nothing
    return out


def collect(events: Iterable[Event]) -> tuple[str, list[ToolCall]]:
    """Events of one output → (content, calls in index order); reasoning is left out."""
    content: list[str] = []
    starts: dict[int, CallStart] = {}
    arguments: dict[int, list[str]] = {}
    for event in events:
        if isinstance(event, ContentPiece):
            content.append(event.text)
        elif isinstance(event, CallStart):
            starts[event.index] = event
            arguments.setdefault(event.index, [])
        elif isinstance(event, ArgumentsPiece):
            arguments.setdefault(event.index, []).append(event.text)
    calls = [
        ToolCall(start.id, start.name, "".join(arguments[index]))
        for index, start in sorted(starts.items())
    ]
    return "".join(content), calls
