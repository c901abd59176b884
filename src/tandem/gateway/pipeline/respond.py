"""Stage: turn worker frames into the answer, a :class:`Completion` or typed events.

Each choice has its own incremental detokenizer and stop-string matcher. When
every choice has finished (stop string, eos or length) the worker stream is
closed, which aborts whatever the worker was still generating. Logprobs, when asked
for, are read from the frames that carry the tokens: a streaming worker's chunks, or
a non-streaming worker's Complete (docs/pd-contract.md §20).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from tandem.gateway import metrics
from tandem.gateway.backends.frames import Frame
from tandem.gateway.context import RequestContext
from tandem.gateway.detokenize import IncrementalDetokenizer
from tandem.gateway.dispatch.streams import OpenedStream
from tandem.gateway.logprobs import LogprobEntry
from tandem.gateway.pipeline.bursts import MAX_BURST, chunk_runs
from tandem.gateway.pipeline.events import (
    AnswerEvent,
    AnswerUsage,
    CallArguments,
    CallStarted,
    ChoiceFinished,
    Completion,
    FinishedChoice,
    ReasoningDelta,
    TextDelta,
    Usage,
)
from tandem.gateway.pipeline.shaping_plan import ChoiceStreamer
from tandem.gateway.stops import StopMatcher
from tandem.gateway.tools.calls import CallStart, ContentPiece, ReasoningPiece


@dataclass(slots=True)
class Choice:
    index: int
    detok: IncrementalDetokenizer
    stops: StopMatcher
    text: list[str] = field(default_factory=list)
    tokens: int = 0
    finish_reason: str | None = None
    logprobs: list[LogprobEntry] = field(default_factory=list)

    def feed(self, token_ids: list[int]) -> tuple[str, int]:
        """New text of this choice (held back while it may be a stop string's start), and
        how many of ``token_ids`` it used: fewer when a stop string ends inside them."""
        if self.finish_reason is not None or not token_ids:
            return "", 0
        if len(token_ids) == 1 or not self.stops.stops:
            # The streamed case: one push, no list of pieces to join (paid per token).
            piece = self.stops.push(self.detok.push(token_ids))
            self.tokens += len(token_ids)
            if piece.stopped:
                self.finish_reason = "stop"
            self.text.append(piece.text)
            return piece.text, len(token_ids)
        else:
            # Several tokens in one frame (a non-streaming worker's Complete, speculative
            # decoding): token by token, so that what follows a stop is not counted, nor
            # its logprobs kept (docs/pd-contract.md §20).
            pieces, used = [], 0
            for token in token_ids:
                pieces.append(self.stops.push(self.detok.push([token])))
                used += 1
                if pieces[-1].stopped:
                    break
        self.tokens += used
        if pieces[-1].stopped:
            self.finish_reason = "stop"
        text = "".join(piece.text for piece in pieces)
        self.text.append(text)
        return text, used

    def finish(self, reason: str) -> str:
        if self.finish_reason is not None:
            return ""
        tail = self.stops.push(self.detok.flush())
        text = tail.text if tail.stopped else tail.text + self.stops.flush()
        self.finish_reason = "stop" if tail.stopped else (reason or "stop")
        self.text.append(text)
        return text


@dataclass(slots=True)
class Event:
    """What one frame added to one choice."""

    index: int
    text: str
    finished: str | None  # the finish reason, on the frame that finished the choice
    logprobs: list[LogprobEntry]


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
        self.streamed_by_worker = ctx.worker_streams
        self.wants_logprobs = ctx.sampling.logprobs is not None
        self.prompt_tokens = len(ctx.routing_ids())
        self.cached_tokens = 0
        self.first_token_at: float | None = None
        self._unfinished = ctx.n  # choices without a finish reason: `done` is asked per frame

    def apply(self, frame: Frame) -> Event:
        """Fold one frame into its choice."""
        choice = self._choice(frame.index)
        was = choice.finish_reason
        if not frame.final:
            if self.first_token_at is None:
                self._mark_first_token(frame.token_ids)
            if not self.wants_logprobs:  # the streamed case, paid per token
                text, _ = choice.feed(list(frame.token_ids))
                return self._event(choice, was, text, [])
            entries = self._logprobs(choice, frame)
            text, used = choice.feed(list(frame.token_ids))
            entries = self._keep(choice, entries, used)
        else:
            self.prompt_tokens = frame.prompt_tokens or self.prompt_tokens
            self.cached_tokens = max(self.cached_tokens, frame.cached_tokens)
            text, entries = "", []
            if not self.streamed_by_worker:
                # A stream's final frame repeats (vLLM) or omits its last delta: chunks only.
                self._mark_first_token(frame.token_ids)
                entries = self._logprobs(choice, frame)
                text, used = choice.feed(list(frame.token_ids))
                entries = self._keep(choice, entries, used)
            text += choice.finish(frame.finish_reason)
        return self._event(choice, was, text, entries)

    def _event(
        self, choice: Choice, was: str | None, text: str, entries: list[LogprobEntry]
    ) -> Event:
        finished = choice.finish_reason if was is None else None
        if finished is not None:
            self._unfinished -= 1
        return Event(choice.index, text, finished, entries)

    def _logprobs(self, choice: Choice, frame: Frame) -> list[LogprobEntry]:
        """The frame's entries; none once the choice has finished."""
        if not self.wants_logprobs or choice.finish_reason is not None:
            return []
        return frame.logprobs() if frame.logprobs is not None else []

    @staticmethod
    def _keep(choice: Choice, entries: list[LogprobEntry], used: int) -> list[LogprobEntry]:
        """The entries of the tokens the choice used, kept on it (a stop string drops the
        rest of the frame's)."""
        kept = entries[:used]
        choice.logprobs.extend(kept)
        return kept

    @property
    def done(self) -> bool:
        return self._unfinished == 0

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
            metrics.child(metrics.TTFT_SECONDS, self.ctx.route).observe(
                self.first_token_at - self.ctx.arrived
            )


async def collect(ctx: RequestContext, opened: OpenedStream) -> Completion:
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
    return Completion([_output(ctx, c) for c in collector.choices], collector.usage())


def _output(ctx: RequestContext, choice: Choice) -> FinishedChoice:
    text, reason = "".join(choice.text), choice.finish_reason or "stop"
    logprobs = choice.logprobs if ctx.sampling.logprobs is not None else None
    stop = choice.stops.matched
    if ctx.shaping is None:
        return FinishedChoice(choice.index, text, reason, logprobs, stop_sequence=stop)
    shaped = ctx.shaping.whole(text, cut=reason == "length")
    calls = list(shaped.calls)
    return FinishedChoice(
        choice.index,
        shaped.content,
        ctx.shaping.finish_reason(reason, bool(calls)),
        logprobs,
        calls or None,
        shaped.reasoning,
        stop,
    )


async def stream_events(ctx: RequestContext, opened: OpenedStream) -> AsyncIterator[AnswerEvent]:
    """The answer as typed events (``events.py``), the usage last."""
    collector = Collector(ctx)
    asked = ctx.sampling.logprobs is not None
    shapers = [ctx.shaping.streamer() for _ in range(ctx.n)] if ctx.shaping else None
    take_ready = getattr(opened.frames, "take_ready", None)
    if take_ready is not None and not inspect.iscoroutinefunction(take_ready):
        take_ready = None  # only the relay's awaitable form is the burst protocol
    ok = False
    try:
        async for frame in opened.frames:
            for event in await _events_now(collector, frame, take_ready):
                stop = collector.choices[event.index].stops.matched if event.finished else None
                if shapers is not None:
                    for piece in _shaped(shapers[event.index], event, stop):
                        yield piece
                else:
                    if event.text or event.logprobs:
                        logprobs = event.logprobs if asked else None
                        yield TextDelta(event.index, event.text, logprobs)
                    if event.finished:
                        yield ChoiceFinished(event.index, event.finished, stop)
            if collector.done:
                break
        ok = True
    finally:
        ctx.usage = collector.usage()  # for the access log, whatever the client asked
        await opened.frames.aclose()
        opened.close(ok)
    yield AnswerUsage(collector.usage())


async def _events_now(
    collector: Collector, frame: Frame, take_ready: Callable[[], Awaitable[Frame | None]] | None
) -> list[Event]:
    """The events of ``frame`` and of the frames that arrived with it, each choice's run of
    them as one event: the tokens of a burst go out in one chunk (as vLLM sends them),
    not one chunk each, and nothing already here waits behind the client's socket. A
    stream that cannot tell what has arrived (``take_ready`` None) gives one event."""
    if take_ready is None or (more := await take_ready()) is None:
        # A frame alone: tokens arrive one by one while the gateway keeps up.
        return [] if collector.done else [collector.apply(frame)]
    frames = [frame, more]
    while len(frames) < MAX_BURST and (more := await take_ready()) is not None:
        frames.append(more)
    events: list[Event] = []
    for run in chunk_runs(frames):
        if collector.done:
            break  # what follows the end of every choice is dropped, as the loop does
        event = collector.apply(run)
        last = events[-1] if events else None
        if last is not None and last.index == event.index and last.finished is None:
            text, entries = last.text + event.text, last.logprobs + event.logprobs
            events[-1] = Event(last.index, text, event.finished, entries)
        else:
            events.append(event)
    return events


def _shaped(shaper: ChoiceStreamer, event: Event, stop: str | None) -> list[AnswerEvent]:
    """One frame's events of a parsed choice: reasoning, content and tool-call pieces;
    ``stop``: the stop string that ended it, on its last frame."""
    index = event.index
    pieces = shaper.push(event.text) if event.text else []
    if event.finished:
        pieces += shaper.finish(cut=event.finished == "length")
    out: list[AnswerEvent] = [TextDelta(index, "", event.logprobs)] if event.logprobs else []
    for piece in pieces:
        if isinstance(piece, ContentPiece):
            if piece.text:
                out.append(TextDelta(index, piece.text))
        elif isinstance(piece, ReasoningPiece):
            out.append(ReasoningDelta(index, piece.text))
        elif isinstance(piece, CallStart):
            out.append(CallStarted(index, piece.index, piece.id, piece.name))
        elif piece.text:
            out.append(CallArguments(index, piece.index, piece.text))
    if event.finished:
        out.append(ChoiceFinished(index, shaper.finish_reason(event.finished), stop))
    return out
