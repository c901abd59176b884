"""The request pipeline's entry point: a generation request in, an answer or a stream out.

One :class:`Pipeline` runs every generation route (chat, completions) through the same
stages over one :class:`~tandem.gateway.context.RequestContext`:

1. admit: refuse while draining, refuse a declared body over the limit, take an
   admission slot (a queued request holds no body and no pixels);
2. read the body; the route's parser validates it and converts it into the pipeline's
   request (``generation_request.py``);
3. prompt: render the template and tokenize (``prompt.py``); the worker protocol's
   backend builds its request (``gateway/backends``);
4. media: choose the path, process router-side images under the pixel lease
   (``media.py``), all within ``--request-timeout-secs``;
5. dispatch: open the worker stream(s) (``tandem.gateway.dispatch``); the request timeout
   covers everything up to the first frame, and for a JSON answer up to its end;
6. respond: collect the JSON answer, or hand the route an event stream (``respond.py``).

It owns what must happen however a request ends: the admission slot and the pixel lease
are released once (a stream keeps its slot until its last byte is sent), and the
access-log record is finished once, in :meth:`Pipeline._finish`. The HTTP side is behind
:class:`Inbound`; route handlers only parse, call :meth:`Pipeline.run` and render.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from tandem.errors import TandemError, make_error
from tandem.gateway.access_log import RequestRecord
from tandem.gateway.admission import PixelLease, Slot
from tandem.gateway.context import RequestContext
from tandem.gateway.dispatch.streams import OpenedStream
from tandem.gateway.pipeline.answer_or_calls import with_answer_or_calls
from tandem.gateway.pipeline.events import AnswerEvent, AnswerMeta, Completion
from tandem.gateway.pipeline.gates import admit, media_in_time, served_model
from tandem.gateway.pipeline.generation_request import GenerationRequest
from tandem.gateway.pipeline.media import prepare_media
from tandem.gateway.pipeline.prompt import prepare_prompt
from tandem.gateway.pipeline.respond import collect, stream_events
from tandem.gateway.pipeline.shaping import shaping_plan
from tandem.gateway.state import GatewayState
from tandem.gateway.tokenizing import parse_large_off_loop
from tandem.gateway.types import Route

log = logging.getLogger("tandem.gateway")
T = TypeVar("T")
# The route's parser: its body validated by its schema and converted; the Responses API's
# is a coroutine (it reads stored turns).
Parser = Callable[[bytes], GenerationRequest | Awaitable[GenerationRequest]]
# What a route does with a JSON answer before the request counts as done (the Responses
# API stores it); a TandemError from it is the request's outcome, as for a stream's
# :attr:`Events.before_end`.
Settle = Callable[["Completed"], Awaitable[None]]


class ClientGone(Exception):
    """The client hung up before the answer was ready (logged as 499)."""


class Inbound(Protocol):
    """What the pipeline needs of the HTTP request it serves."""

    @property
    def tenant(self) -> str | None: ...

    @property
    def declared_length(self) -> int | None: ...

    async def read_body(self, limit: int) -> bytes:
        """The body; 413 ``payload_too_large`` past ``limit``, :class:`ClientGone`."""
        ...

    async def until_disconnect(self, work: Awaitable[T]) -> T:
        """Run ``work``; cancel it and raise :class:`ClientGone` if the client leaves."""
        ...


@dataclass(slots=True)
class Answered:
    """A JSON answer already in its endpoint's dialect."""

    body: dict[str, Any]
    request_id: str


@dataclass(slots=True)
class Completed:
    """The pipeline's JSON answer, for the endpoint to render (``pipeline/events.py``)."""

    answer: Completion
    meta: AnswerMeta
    request_id: str


@dataclass(slots=True)
class Failed:
    error: TandemError
    request_id: str


@dataclass(slots=True)
class Gone:
    request_id: str


@dataclass(slots=True)
class Streaming:
    """An SSE answer: ``events`` to send, then ``sent`` (awaited whatever happened)."""

    events: AsyncIterator[dict[str, Any] | bytes]  # bytes: an event framed already
    sent: Callable[[], Awaitable[None]]
    request_id: str
    named: bool = False  # Responses API events: ``event: <type>`` lines, no [DONE]


@dataclass(slots=True)
class Events:
    """The pipeline's stream, for the endpoint to render: typed events, then ``sent``."""

    events: AsyncIterator[AnswerEvent]
    meta: AnswerMeta
    sent: Callable[[], Awaitable[None]]
    request_id: str
    # Set by the route before it reads the events: run once the last one has been read,
    # before the request counts as done, so a TandemError from it (the Responses API's
    # store failing) is the request's outcome in the access log and metrics too.
    before_end: Callable[[], Awaitable[None]] | None = None


# What an endpoint answers with (rendered) and what the pipeline hands it (neutral).
Outcome = Answered | Failed | Gone | Streaming
PipelineOutcome = Completed | Events | Failed | Gone


@dataclass(slots=True)
class _Held:
    """What a request holds while it runs; each is released once."""

    slot: Slot | None = None
    lease: PixelLease | None = None

    def release_lease(self) -> None:
        if self.lease is not None:
            self.lease.release()

    def release(self) -> None:
        self.release_lease()
        if self.slot is not None:
            self.slot.release()


class Pipeline:
    def __init__(self, state: GatewayState) -> None:
        self.state = state
        self.config = state.config

    async def run(
        self, inbound: Inbound, route: Route, parse: Parser, settle: Settle | None = None
    ) -> PipelineOutcome:
        record = RequestRecord(route, enabled=self.config.access_log, tenant=inbound.tenant)
        held = _Held()
        ctx: RequestContext | None = None
        try:
            held.slot = await admit(self.state, inbound)
            raw = await inbound.read_body(self.config.max_payload_size)
            # A large body is counted, parsed and checked on the tokenizing pool.
            parsed = await parse_large_off_loop(raw, parse)
            request = await parsed if inspect.isawaitable(parsed) else parsed
            # Charged by the media stage before any image is decoded, then holding only the
            # pixel tensor until it is sent (docs/operations.md, "Memory bounds for images").
            held.lease = self.state.pixel_budget.lease()
            ctx = await self._prepare(request, route, record.request_id, held.lease)
            if ctx.stream:
                return await self._streaming(inbound, ctx, record, held)
            answer = await inbound.until_disconnect(self._answer(ctx, held))
            completed = Completed(answer, _meta(ctx), record.request_id)
            if settle is not None:
                await settle(completed)
        except TandemError as err:
            _name_constraint(err, ctx)
            self._finish(record, ctx, err.status, err.code)
            return Failed(err, record.request_id)
        except ClientGone:
            self._finish(record, ctx, 499, "client_disconnected")
            return Gone(record.request_id)
        except Exception:
            log.exception("unexpected failure on %s (%s)", route, record.request_id)
            bug = make_error("internal_error", "internal error; see the gateway log")
            self._finish(record, ctx, bug.status, bug.code)
            return Failed(bug, record.request_id)
        finally:
            held.release()  # a stream has taken its slot over
        self._finish(record, ctx, 200, "")
        return completed

    async def _prepare(
        self, request: GenerationRequest, route: Route, request_id: str, lease: PixelLease
    ) -> RequestContext:
        state = self.state
        model = await served_model(state, request.model)
        ctx = RequestContext(route, request_id, request, model)
        await prepare_prompt(ctx)
        ctx.shaping = shaping_plan(ctx, self.config)
        with_answer_or_calls(ctx)  # tool_choice auto beside a response_format
        state.backend.build_request(ctx)
        if not ctx.media_urls:
            return ctx  # no media stage: no task or timer for a text request
        workers = state.registry.workers(model_id=model.model_id)
        await media_in_time(
            self.config.request_timeout_s,
            prepare_media(
                ctx,
                self.config,
                workers,
                lease,
                backend=state.backend,
                pool=self.state.image_pool,
                cache=self.state.pixel_cache,
            ),
        )
        return ctx

    async def _answer(self, ctx: RequestContext, held: _Held) -> Completion:
        try:
            async with asyncio.timeout(self.config.request_timeout_s):
                opened = await self.state.dispatcher.open(ctx)
                held.release_lease()  # the first frame is back: the pixels have gone
                return await collect(ctx, opened)
        except TimeoutError:
            raise self._timed_out("no answer") from None

    async def _open(self, ctx: RequestContext) -> OpenedStream:
        """A stream's legs up to the first frame; the rest is bounded by the gRPC deadline."""
        try:
            async with asyncio.timeout(self.config.request_timeout_s):
                return await self.state.dispatcher.open(ctx)
        except TimeoutError:
            raise self._timed_out("no first token") from None

    async def _streaming(
        self, inbound: Inbound, ctx: RequestContext, record: RequestRecord, held: _Held
    ) -> Events:
        opened = await inbound.until_disconnect(self._open(ctx))
        held.release_lease()  # the first frame is back: the pixels have gone
        # The slot is held until the last byte is sent (or the client is gone).
        slot, held.slot = held.slot, None

        async def sent() -> None:
            if slot is not None:
                slot.release()
            # Only counts if the stream never started (a client gone before its first byte).
            self._finish(record, ctx, 499, "client_disconnected")
            # A stream that never started must still end its worker calls and settle their
            # in-flight counts (no-ops after a normal end).
            await opened.abandon()

        # The generator reads the route's hook at the stream's end, once the route has set it.
        events = self._observed(stream_events(ctx, opened), ctx, record, lambda: outcome.before_end)
        outcome = Events(events, _meta(ctx), sent, record.request_id)
        return outcome

    async def _observed(
        self,
        events: AsyncIterator[AnswerEvent],
        ctx: RequestContext,
        record: RequestRecord,
        before_end: Callable[[], Callable[[], Awaitable[None]] | None],
    ) -> AsyncIterator[AnswerEvent]:
        status, code = 200, ""
        try:
            async for event in events:
                yield event
            hook = before_end()
            if hook is not None:
                await hook()
        except TandemError as err:
            status, code = err.status, err.code
            raise
        except (asyncio.CancelledError, GeneratorExit):
            status, code = 499, "client_disconnected"  # the client left mid-stream
            raise
        finally:
            self._finish(record, ctx, status, code)

    def _finish(
        self, record: RequestRecord, ctx: RequestContext | None, status: int, code: str
    ) -> None:
        """The one place a request's access-log record ends (the first call counts)."""
        record.finish(status, code, ctx)

    def _timed_out(self, what: str) -> TandemError:
        limit = self.config.request_timeout_s
        return make_error("request_timeout", f"{what} within --request-timeout-secs={limit}")


def _meta(ctx: RequestContext) -> AnswerMeta:
    request, strings = ctx.request, ctx.model.token_strings
    return AnswerMeta(request.model, ctx.n, request.include_usage, ctx.sampling.logprobs, strings)


def _name_constraint(err: TandemError, ctx: RequestContext | None) -> None:
    """A worker's refusal of the constraint names the field it came from, as ours do."""
    if err.code == "invalid_structured_output" and err.param is None and ctx is not None:
        constraint = ctx.sampling.constraint
        if constraint is not None:
            err.param = constraint.param
