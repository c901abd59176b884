"""What the pipeline answers, in no endpoint's dialect: typed events and a finished answer.

A stream is a sequence of :data:`AnswerEvent` (per choice: text, reasoning and tool-call
pieces, then its finish; the usage last). A JSON answer is a :class:`Completion`. Each
endpoint renders them its own way (chat and legacy-completions chunks, the Responses
API's events); :class:`AnswerMeta` carries what rendering needs of the request.
"""

from __future__ import annotations

from dataclasses import dataclass

from tandem.gateway.logprobs import LogprobEntry, TokenStrings
from tandem.gateway.tools.calls import ToolCall


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens in and out; ``cached_tokens``: the prompt's tokens a prefix cache served."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0


@dataclass(frozen=True, slots=True)
class TextDelta:
    """A piece of a choice's text. ``logprobs``: the entries of the tokens behind it when
    they were asked for (an empty text with entries: tokens whose text is held back or
    went to reasoning or a call); None: nothing to render."""

    choice: int
    text: str
    logprobs: list[LogprobEntry] | None = None


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    choice: int
    text: str


@dataclass(frozen=True, slots=True)
class CallStarted:
    """A tool call's start: its position among the choice's calls, id and name."""

    choice: int
    call: int
    call_id: str
    name: str


@dataclass(frozen=True, slots=True)
class CallArguments:
    choice: int
    call: int
    text: str


@dataclass(frozen=True, slots=True)
class ChoiceFinished:
    choice: int
    reason: str  # "stop", "length", "tool_calls"
    stop_sequence: str | None = None  # the client's stop string that ended it, if one did


@dataclass(frozen=True, slots=True)
class AnswerUsage:
    """Sent once, after every choice finished."""

    usage: Usage


AnswerEvent = (
    TextDelta | ReasoningDelta | CallStarted | CallArguments | ChoiceFinished | AnswerUsage
)


@dataclass(frozen=True, slots=True)
class FinishedChoice:
    """One choice of a JSON answer. ``text`` None: a chat message that holds calls only."""

    index: int
    text: str | None
    finish_reason: str
    logprobs: list[LogprobEntry] | None = None  # None: not asked for
    calls: list[ToolCall] | None = None
    reasoning: str | None = None
    stop_sequence: str | None = None  # the client's stop string that ended it, if one did


@dataclass(frozen=True, slots=True)
class Completion:
    choices: list[FinishedChoice]
    usage: Usage


@dataclass(frozen=True, slots=True)
class AnswerMeta:
    """What an endpoint's rendering needs of the request it answers."""

    model: str  # the model name as the client sent it
    n: int
    include_usage: bool  # a stream's usage chunk (chat and completions)
    logprob_alternatives: int | None  # None: logprobs not asked for
    token_strings: TokenStrings
