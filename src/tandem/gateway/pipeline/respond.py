"""Stage: turn worker frames into the OpenAI answer, JSON or SSE.

Each choice has its own incremental detokenizer and stop-string matcher. When
every choice has finished (stop string, eos or length) the worker stream is
closed, which aborts whatever the worker was still generating.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from tandem.gateway import metrics
from tandem.gateway.api.responses import (
    ChatChunkBuilder,
    ChoiceOutput,
    TextChunkBuilder,
    Usage,
    chat_completion,
    new_response_id,
    now,
    text_completion,
)
from tandem.gateway.context import RequestContext
from tandem.gateway.detokenize import IncrementalDetokenizer
from tandem.gateway.dispatch.streams import OpenedStream
from tandem.gateway.stops import StopMatcher
from tandem.wire.proto import pb


@dataclass(slots=True)
class Choice:
    index: int
    detok: IncrementalDetokenizer
    stops: StopMatcher
    text: list[str] = field(default_factory=list)
    tokens: int = 0
    finish_reason: str | None = None

    def feed(self, token_ids: list[int]) -> str:
        """New text of this choice (held back while it may be a stop string's start)."""
        if self.finish_reason is not None or not token_ids:
            return ""
        self.tokens += len(token_ids)
        result = self.stops.push(self.detok.push(token_ids))
        if result.stopped:
            self.finish_reason = "stop"
        self.text.append(result.text)
        return result.text

    def finish(self, reason: str) -> str:
        if self.finish_reason is not None:
            return ""
        tail = self.stops.push(self.detok.flush())
        text = tail.text if tail.stopped else tail.text + self.stops.flush()
        self.finish_reason = "stop" if tail.stopped else (reason or "stop")
        self.text.append(text)
        return text


class Collector:
    """Folds frames into choices and usage; shared by the JSON and SSE answers."""

    def __init__(self, ctx: RequestContext) -> None:
        tokenizer = ctx.model.tokenizer
        skip = ctx.sampling.skip_special_tokens
        self.ctx = ctx
        self.choices = [
            Choice(i, IncrementalDetokenizer(tokenizer, skip), StopMatcher(ctx.sampling.stop))
            for i in range(ctx.n)
        ]
        self.streamed_by_worker = bool(ctx.wire and ctx.wire.stream)
        self.prompt_tokens = len(ctx.wire.tokenized.input_ids) if ctx.wire else 0
        self.cached_tokens = 0
        self.first_token_at: float | None = None

    def apply(self, frame: pb.GenerateResponse) -> list[tuple[int, str, str | None]]:
        """Fold one frame; returns (index, new text, finish reason if it just finished)."""
        events = []
        if frame.HasField("chunk"):
            chunk = frame.chunk
            choice = self._choice(chunk.index)
            self._mark_first_token(chunk.token_ids)
            was = choice.finish_reason
            text = choice.feed(list(chunk.token_ids))
            events.append((choice.index, text, choice.finish_reason if was is None else None))
        else:
            done = frame.complete
            choice = self._choice(done.index)
            self.prompt_tokens = done.prompt_tokens or self.prompt_tokens
            self.cached_tokens = max(self.cached_tokens, done.cached_tokens)
            was = choice.finish_reason
            text = ""
            if not self.streamed_by_worker:
                self._mark_first_token(done.output_ids)
                text = choice.feed(list(done.output_ids))
            text += choice.finish(done.finish_reason)
            events.append((choice.index, text, choice.finish_reason if was is None else None))
        return events

    @property
    def done(self) -> bool:
        return all(c.finish_reason is not None for c in self.choices)

    def usage(self) -> Usage:
        completion = sum(c.tokens for c in self.choices)
        return Usage(self.prompt_tokens, completion, self.cached_tokens)

    def _choice(self, index: int) -> Choice:
        if not 0 <= index < len(self.choices):
            raise ValueError(f"worker answered for choice {index} of {len(self.choices)}")
        return self.choices[index]

    def _mark_first_token(self, token_ids: Any) -> None:
        if self.first_token_at is None and len(token_ids):
            self.first_token_at = time.perf_counter()
            metrics.TTFT_SECONDS.labels(self.ctx.route).observe(
                self.first_token_at - self.ctx.arrived
            )


async def collect(ctx: RequestContext, opened: OpenedStream) -> dict[str, Any]:
    collector = Collector(ctx)
    ok = False
    try:
        async for frame in opened.frames:
            collector.apply(frame)
            if collector.done:
                break
        ok = True
    finally:
        ctx.usage = collector.usage()  # for the access log, whatever the client asked
        await opened.frames.aclose()
        opened.close(ok)
    choices = [
        ChoiceOutput(c.index, "".join(c.text), c.finish_reason or "stop") for c in collector.choices
    ]
    model_name = ctx.body.model
    if ctx.route == "chat":
        return chat_completion(
            new_response_id("chatcmpl"), model_name, now(), choices, collector.usage()
        )
    return text_completion(new_response_id("cmpl"), model_name, now(), choices, collector.usage())


async def stream_events(ctx: RequestContext, opened: OpenedStream) -> AsyncIterator[dict[str, Any]]:
    collector = Collector(ctx)
    chat = ctx.route == "chat"
    prefix = "chatcmpl" if chat else "cmpl"
    builder_cls = ChatChunkBuilder if chat else TextChunkBuilder
    builder = builder_cls(new_response_id(prefix), ctx.body.model, now(), ctx.body.include_usage)
    ok = False
    try:
        if isinstance(builder, ChatChunkBuilder):  # chat streams open with the role
            for choice in collector.choices:
                yield builder.start(choice.index)
        async for frame in opened.frames:
            for index, text, finished in collector.apply(frame):
                if text:
                    yield builder.delta(index, text)
                if finished:
                    yield builder.finish(index, finished)
            if collector.done:
                break
        ok = True
    finally:
        ctx.usage = collector.usage()  # for the access log, whatever the client asked
        await opened.frames.aclose()
        opened.close(ok)
    if ctx.body.include_usage:
        yield builder.usage(collector.usage())
