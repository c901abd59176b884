"""The pipeline's answer events retold as Anthropic's named stream events.

    message_start (the Message with empty content), ping,
    per content block: content_block_start, content_block_delta… (text_delta,
        thinking_delta or input_json_delta), content_block_stop,
    message_delta (stop_reason, stop_sequence, usage), message_stop.

A ``ping`` follows ``message_start`` (as Anthropic's API sends one) and is repeated while
no answer event has come for :data:`PING_EVERY_S`, so that proxies and clients with idle
timeouts keep the connection. The pipeline hands the stream over once the worker's first
frame is back, so the wait before the first token is bounded by ``--request-timeout-secs``
and answered with a JSON error, not a stream. The prompt's token count is known at the end:
``message_start`` says 0 input tokens and ``message_delta`` carries the real, cumulative
count (the SDK overwrites the start's with it). A failure after the start is an ``error``
event, ``{"type": "error", "error": {type, message}}``, and ends the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from tandem.errors import TandemError, make_error
from tandem.gateway.endpoints.messages.render import (
    matched_stop,
    message_envelope,
    new_message_id,
    stop_reason,
    tool_use_id,
    usage_dict,
)
from tandem.gateway.http.render import anthropic_error_body
from tandem.gateway.pipeline.events import (
    AnswerEvent,
    AnswerMeta,
    AnswerUsage,
    CallArguments,
    CallStarted,
    ChoiceFinished,
    ReasoningDelta,
    TextDelta,
)

log = logging.getLogger("tandem.gateway.endpoints.messages")

PING_EVERY_S = 10.0
PING: dict[str, Any] = {"type": "ping"}


class BlockWriter:
    """Opens, feeds and closes content blocks; one is open at a time, as in Anthropic's."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None  # "text" | "thinking" | "tool_use"
        self.calls: dict[int, int] = {}  # the pipeline's call index -> its block index
        self.finish_reason = "stop"
        self.stop_sequence: str | None = None

    def push(self, event: AnswerEvent) -> list[dict[str, Any]]:
        if isinstance(event, TextDelta):
            return self._delta("text", {"type": "text_delta", "text": event.text}, event.text)
        if isinstance(event, ReasoningDelta):
            delta = {"type": "thinking_delta", "thinking": event.text}
            return self._delta("thinking", delta, event.text)
        if isinstance(event, CallStarted):
            events = self.close()
            self.index += 1
            self.open = "tool_use"
            self.calls[event.call] = self.index
            block = {"type": "tool_use", "id": tool_use_id(event.call_id), "name": event.name}
            events.append(self._start({**block, "input": {}}))
            return events
        if isinstance(event, CallArguments):
            at = self.calls.get(event.call)
            if at is None or at != self.index or not event.text:
                return []
            delta = {"type": "input_json_delta", "partial_json": event.text}
            return [{"type": "content_block_delta", "index": at, "delta": delta}]
        if isinstance(event, ChoiceFinished):
            self.finish_reason = event.reason
            self.stop_sequence = matched_stop(event)
        return []

    def _delta(self, kind: str, delta: dict[str, Any], text: str) -> list[dict[str, Any]]:
        if not text:
            return []  # logprobs only: the Messages API has none to carry
        events: list[dict[str, Any]] = []
        if self.open != kind:
            events = self.close()
            self.index += 1
            self.open = kind
            empty = {"type": "text", "text": ""}
            if kind == "thinking":
                empty = {"type": "thinking", "thinking": "", "signature": ""}
            events.append(self._start(empty))
        events.append({"type": "content_block_delta", "index": self.index, "delta": delta})
        return events

    def _start(self, block: dict[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_start", "index": self.index, "content_block": block}

    def close(self) -> list[dict[str, Any]]:
        if self.open is None:
            return []
        self.open = None
        return [{"type": "content_block_stop", "index": self.index}]


async def message_events(
    meta: AnswerMeta, answer: AsyncIterator[AnswerEvent]
) -> AsyncIterator[dict[str, Any]]:
    """The whole event sequence of one streamed Message."""
    start = message_envelope(new_message_id(), meta.model)
    start["usage"] = {"input_tokens": 0, "output_tokens": 0}
    yield {"type": "message_start", "message": start}
    yield PING
    writer = BlockWriter()
    try:
        async for event in with_pings(answer, PING_EVERY_S):
            if event is None:
                yield PING
            elif isinstance(event, AnswerUsage):
                for closing in writer.close():
                    yield closing
                stop = writer.stop_sequence
                reason = stop_reason(writer.finish_reason, stop, bool(writer.calls))
                delta = {"stop_reason": reason, "stop_sequence": stop}
                yield {"type": "message_delta", "delta": delta, "usage": usage_dict(event.usage)}
                yield {"type": "message_stop"}
            else:
                for out in writer.push(event):
                    yield out
    except TandemError as err:
        yield anthropic_error_body(err)
    except Exception:
        log.exception("Messages stream failed mid-answer")
        yield anthropic_error_body(make_error("internal_error", "internal error while streaming"))


async def with_pings(
    events: AsyncIterator[AnswerEvent], every: float
) -> AsyncIterator[AnswerEvent | None]:
    """``events``, with a None each time ``every`` seconds pass without one.

    The next event is awaited in a task so that a timeout does not cancel the stream; the
    task is cancelled, and the stream closed, however this generator ends.
    """
    pending: asyncio.Future[AnswerEvent] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(events))
            done, _ = await asyncio.wait({pending}, timeout=every)
            if not done:
                yield None
                continue
            finished, pending = pending, None
            try:
                event = finished.result()
            except StopAsyncIteration:
                return
            yield event
    finally:
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()
