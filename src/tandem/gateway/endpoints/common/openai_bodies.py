"""OpenAI's chat and legacy-completions response bodies and chunks, as plain dicts.

Plain dicts rather than pydantic models: one is built per streamed token, and a
dict plus ``json.dumps`` costs a fraction of model construction and dumping. The
commonest chunk, a piece of text without logprobs, is cheaper still as bytes
(:meth:`_ChunkBuilder.text_event`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tandem.gateway.http.json_bodies import json_string_bytes
from tandem.gateway.http.sse import sse_event
from tandem.gateway.logprobs import LogprobEntry
from tandem.gateway.pipeline.events import FinishedChoice, Usage

CHAT_OBJECT = "chat.completion"
CHAT_CHUNK_OBJECT = "chat.completion.chunk"
TEXT_OBJECT = "text_completion"
# Stands for a delta's text while a choice's chunk is encoded once around it (JSON writes
# it as the escape \u0000; a model name that held one too turns the shortcut off).
_TEXT_MARK = "\x00"
_TEXT_MARK_JSON = b'"\\u0000"'


def new_response_id(prefix: str) -> str:
    """``chatcmpl-…`` / ``cmpl-…``: unique per response, as OpenAI's ids are."""
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def usage_dict(usage: Usage) -> dict[str, Any]:
    """OpenAI's usage object."""
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


@dataclass(frozen=True, slots=True)
class ChoiceOutput:
    """The finished text of one choice (one of the ``n`` samples)."""

    index: int
    text: str | None  # None: a chat message that holds tool calls only
    finish_reason: str | None
    logprobs: dict[str, Any] | None = None  # already in the route's shape
    tool_calls: list[dict[str, Any]] | None = None  # OpenAI's message.tool_calls
    reasoning: str | None = None  # reasoning_content, when a reasoning parser split it off


def tool_call_dict(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _message(c: ChoiceOutput) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": c.text}
    if c.reasoning is not None:
        message["reasoning_content"] = c.reasoning
    if c.tool_calls:
        message["tool_calls"] = c.tool_calls
    return message


def chat_completion(
    response_id: str, model: str, created: int, choices: Sequence[ChoiceOutput], usage: Usage
) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": CHAT_OBJECT,
        "created": created,
        "model": model,
        "choices": [
            {
                "index": c.index,
                "message": _message(c),
                "logprobs": c.logprobs,
                "finish_reason": c.finish_reason,
            }
            for c in choices
        ],
        "usage": usage_dict(usage),
    }


def text_completion(
    response_id: str, model: str, created: int, choices: Sequence[ChoiceOutput], usage: Usage
) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": TEXT_OBJECT,
        "created": created,
        "model": model,
        "choices": [
            {
                "index": c.index,
                "text": c.text,
                "logprobs": c.logprobs,
                "finish_reason": c.finish_reason,
            }
            for c in choices
        ],
        "usage": usage_dict(usage),
    }


class _ChunkBuilder:
    """Shared envelope of one streamed response: same id, model and created on every chunk."""

    _object: str

    def __init__(
        self, response_id: str, model: str, created: int, include_usage: bool = False
    ) -> None:
        self.response_id = response_id
        self.model = model
        self.created = created
        self.include_usage = include_usage
        # Per choice: the framed event of a text delta, cut where its text goes.
        self._around_text: dict[int, list[bytes]] = {}

    def delta(
        self, index: int, text: str, logprobs: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        raise NotImplementedError

    def text_event(self, index: int, text: str) -> bytes:
        """``sse_event(self.delta(index, text))``, byte for byte, without building or
        encoding the chunk: it is encoded once per choice and each delta only escapes its
        text (0.2 µs against 10 µs for the dict's JSON, paid per streamed token)."""
        around = self._around_text.get(index)
        if around is None:
            around = sse_event(self.delta(index, _TEXT_MARK)).split(_TEXT_MARK_JSON)
            self._around_text[index] = around
        if len(around) != 2:  # the mark came out twice: no shortcut for this stream
            return sse_event(self.delta(index, text))
        return around[0] + json_string_bytes(text) + around[1]

    def _chunk(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        chunk: dict[str, Any] = {
            "id": self.response_id,
            "object": self._object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if self.include_usage:
            # OpenAI sends "usage": null on every chunk but the last when usage is asked for.
            chunk["usage"] = None
        return chunk

    def usage(self, usage: Usage) -> dict[str, Any]:
        """The usage-only chunk sent last (after every choice finished) with include_usage."""
        chunk = self._chunk([])
        chunk["usage"] = usage_dict(usage)
        return chunk


class ChatChunkBuilder(_ChunkBuilder):
    """Chunks of a streamed chat completion.

    Per choice: :meth:`start` once (the role), :meth:`delta` per piece of text,
    :meth:`finish` once (the finish reason, with an empty delta).
    """

    _object = CHAT_CHUNK_OBJECT

    def _choice(
        self,
        index: int,
        delta: dict[str, Any],
        finish_reason: str | None,
        logprobs: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        return self._chunk(
            [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}]
        )

    def start(self, index: int) -> dict[str, Any]:
        return self._choice(index, {"role": "assistant", "content": ""}, None)

    def delta(
        self, index: int, text: str, logprobs: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """A piece of text; ``logprobs`` (``{"content": [...]}``) of the tokens behind it."""
        return self._choice(index, {"content": text}, None, logprobs)

    def reasoning(self, index: int, text: str) -> dict[str, Any]:
        return self._choice(index, {"reasoning_content": text}, None)

    def call_start(self, index: int, call: int, call_id: str, name: str) -> dict[str, Any]:
        """A tool call's first delta: its index, id and name (arguments follow in pieces)."""
        opening = {**tool_call_dict(call_id, name, ""), "index": call}
        return self._choice(index, {"tool_calls": [opening]}, None)

    def call_arguments(self, index: int, call: int, text: str) -> dict[str, Any]:
        return self._choice(
            index, {"tool_calls": [{"index": call, "function": {"arguments": text}}]}, None
        )

    def finish(self, index: int, finish_reason: str) -> dict[str, Any]:
        return self._choice(index, {}, finish_reason)


class TextChunkBuilder(_ChunkBuilder):
    """Chunks of a streamed text completion: :meth:`delta` per piece, :meth:`finish` once."""

    _object = TEXT_OBJECT

    def _choice(
        self,
        index: int,
        text: str,
        finish_reason: str | None,
        logprobs: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        return self._chunk(
            [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}]
        )

    def delta(
        self, index: int, text: str, logprobs: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        return self._choice(index, text, None, logprobs)

    def finish(self, index: int, finish_reason: str) -> dict[str, Any]:
        return self._choice(index, "", finish_reason)


def choice_output(
    choice: FinishedChoice, render: Callable[[list[LogprobEntry]], dict[str, Any]]
) -> ChoiceOutput:
    """A finished choice in the shape both dialects' bodies take (logprobs rendered)."""
    calls = [tool_call_dict(c.id, c.name, c.arguments) for c in choice.calls or ()]
    logprobs = render(choice.logprobs) if choice.logprobs is not None else None
    return ChoiceOutput(
        choice.index, choice.text, choice.finish_reason, logprobs, calls or None, choice.reasoning
    )
