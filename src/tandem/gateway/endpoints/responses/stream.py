"""The pipeline's answer events retold as the Responses API's event sequence.

The pipeline streams typed events (``pipeline/events.py``): reasoning, content and tool-call
pieces, a finish, then usage. :class:`EventWriter` turns them into OpenAI's events, the
ones ``client.responses.stream(...)`` accumulates:

    response.created, response.in_progress,
    per output item: response.output_item.added,
        message:   response.content_part.added, response.output_text.delta…,
                   response.output_text.done, response.content_part.done
        reasoning: response.content_part.added, response.reasoning_text.delta…,
                   response.reasoning_text.done, response.content_part.done
        call:      response.function_call_arguments.delta…, …arguments.done
    response.output_item.done,
    then response.completed (or response.incomplete, or response.failed).

Every event carries a ``sequence_number`` counting from 0.
"""

from __future__ import annotations

from typing import Any

from tandem.errors import TandemError
from tandem.gateway.endpoints.responses.items import new_item_id
from tandem.gateway.endpoints.responses.objects import (
    Answer,
    CountTokens,
    ResponseHeader,
    call_item,
    failed,
    finished,
    message_item,
    output_text_part,
    reasoning_item,
)
from tandem.gateway.logprobs import TokenStrings, chat_content
from tandem.gateway.pipeline.events import (
    AnswerEvent,
    AnswerUsage,
    CallArguments,
    CallStarted,
    ReasoningDelta,
    TextDelta,
)


class _Open:
    """The output item being streamed: its kind, id, position and text so far."""

    def __init__(self, kind: str, index: int, call: tuple[str, str] | None = None) -> None:
        self.kind = kind  # "message" | "reasoning" | "function_call"
        self.id = new_item_id(kind)
        self.index = index
        self.call = call  # (call id, name) of a function call
        self.text: list[str] = []
        self.logprobs: list[dict[str, Any]] = []


class EventWriter:
    def __init__(self, header: ResponseHeader, count: CountTokens, strings: TokenStrings) -> None:
        self.header = header
        self.count = count
        self.strings = strings  # token texts, for the logprobs of output_text deltas
        self.sequence = 0
        self.output: list[dict[str, Any]] = []  # finished items, in order
        self.open: _Open | None = None
        self.calls: dict[int, _Open] = {}  # chat tool-call index -> its item
        self.answer = Answer()
        # Logprobs that came before the text they belong to (a parsed stream sends a frame's
        # logprobs first, then its pieces): they join the message's next text, or are
        # dropped with the reasoning or call the frame turned out to be.
        self.pending: list[dict[str, Any]] = []

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, **fields, "sequence_number": self.sequence}
        self.sequence += 1
        return event

    def start(self) -> list[dict[str, Any]]:
        snapshot = self.header.envelope("in_progress", [])
        return [
            self._event("response.created", response=snapshot),
            self._event("response.in_progress", response=snapshot),
        ]

    def push(self, event: AnswerEvent) -> list[dict[str, Any]]:
        """The Responses events of one answer event."""
        if isinstance(event, AnswerUsage):
            self.answer.usage = event.usage
        elif isinstance(event, ReasoningDelta):
            if event.text:
                self.pending = []
                return self._text("reasoning", event.text, [])
        elif isinstance(event, TextDelta):
            logprobs = chat_content(event.logprobs or [], self.strings)
            if event.text:
                return self._text("message", event.text, self._take(logprobs))
            if logprobs and self.open is not None and self.open.kind == "message":
                return self._text("message", "", self._take(logprobs))
            # Never an item of its own: that would close an open call or reasoning item
            # (and once lost a call's arguments).
            self.pending += logprobs
        elif isinstance(event, CallStarted):
            self.pending = []
            return self._start_call(event)
        elif isinstance(event, CallArguments):
            self.pending = []
            return self._call_arguments(event)
        else:
            self.answer.finish_reason = event.reason
        return []

    def _take(self, logprobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        taken, self.pending = [*self.pending, *logprobs], []
        return taken

    def _text(self, kind: str, text: str, logprobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        events = [] if self.open and self.open.kind == kind else self._switch(kind)
        item = self.open
        assert item is not None
        item.text.append(text)
        item.logprobs += logprobs
        if kind == "message":
            events.append(
                self._event(
                    "response.output_text.delta",
                    item_id=item.id,
                    output_index=item.index,
                    content_index=0,
                    delta=text,
                    logprobs=logprobs,
                )
            )
        else:
            events.append(
                self._event(
                    "response.reasoning_text.delta",
                    item_id=item.id,
                    output_index=item.index,
                    content_index=0,
                    delta=text,
                )
            )
        return events

    def _start_call(self, event: CallStarted) -> list[dict[str, Any]]:
        """A call's first piece: its id and name open an item of its own."""
        events = self._close()
        started = _Open("function_call", len(self.output), (event.call_id, event.name))
        self.open = self.calls[event.call] = started
        added = call_item(started.id, "in_progress", event.call_id, event.name, "")
        events.append(
            self._event("response.output_item.added", output_index=started.index, item=added)
        )
        return events

    def _call_arguments(self, event: CallArguments) -> list[dict[str, Any]]:
        item = self.calls.get(event.call)
        if item is None or not event.text:
            return []
        item.text.append(event.text)
        delta = self._event(
            "response.function_call_arguments.delta",
            item_id=item.id,
            output_index=item.index,
            delta=event.text,
        )
        return [delta]

    def _switch(self, kind: str) -> list[dict[str, Any]]:
        events = self._close()
        item = self.open = _Open(kind, len(self.output))
        if kind == "message":
            added = message_item(item.id, "in_progress", [])
            part = output_text_part("", [])
        else:
            added = reasoning_item(item.id, None)
            part = {"type": "reasoning_text", "text": ""}
        events.append(
            self._event("response.output_item.added", output_index=item.index, item=added)
        )
        events.append(
            self._event(
                "response.content_part.added",
                item_id=item.id,
                output_index=item.index,
                content_index=0,
                part=part,
            )
        )
        return events

    def _close(self, status: str = "completed") -> list[dict[str, Any]]:
        item, self.open = self.open, None
        if item is None:
            return []
        text = "".join(item.text)
        where = {"item_id": item.id, "output_index": item.index}
        events = []
        if item.kind == "function_call":
            call_id, name = item.call  # type: ignore[misc]
            done = call_item(item.id, status, call_id, name, text)
            self.answer.calls.append((call_id, name, text))
            events.append(
                self._event(
                    "response.function_call_arguments.done", **where, arguments=text, name=name
                )
            )
        elif item.kind == "message":
            part = output_text_part(text, item.logprobs)
            done = message_item(item.id, status, [part])
            self.answer.content += text
            events.append(
                self._event(
                    "response.output_text.done",
                    **where,
                    content_index=0,
                    text=text,
                    logprobs=item.logprobs,
                )
            )
            events.append(
                self._event("response.content_part.done", **where, content_index=0, part=part)
            )
        else:
            done = reasoning_item(item.id, text)
            self.answer.reasoning = (self.answer.reasoning or "") + text
            events.append(
                self._event("response.reasoning_text.done", **where, content_index=0, text=text)
            )
            part = {"type": "reasoning_text", "text": text}
            events.append(
                self._event("response.content_part.done", **where, content_index=0, part=part)
            )
        self.output.append(done)
        events.append(self._event("response.output_item.done", output_index=item.index, item=done))
        return events

    def _part_done(self, where: dict[str, Any], part: dict[str, Any]) -> dict[str, Any]:
        return self._event("response.content_part.done", **where, content_index=0, part=part)

    def finish(self) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The closing events and the final Response (to store before it is sent)."""
        events: list[dict[str, Any]] = []
        if not self.output and self.open is None:
            events += self._switch("message")  # an empty answer is still one message
        if self.pending and self.open is not None and self.open.kind == "message":
            events += self._text("message", "", self._take([]))
        cut = self.answer.finish_reason == "length"
        events += self._close("incomplete" if cut else "completed")
        body = finished(self.header, self.answer, self.output, self.count)
        kind = "response.incomplete" if cut else "response.completed"
        return [*events, self._event(kind, response=body)], body

    def fail(self, err: TandemError) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The failure event and the failed Response (the items that finished, kept)."""
        self.open = None
        body = failed(self.header, err, self.output)
        return [self._event("response.failed", response=body)], body
