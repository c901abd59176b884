"""The Responses API: create (through the chat pipeline), retrieve, delete, input items.

A created response is stored — when ``store`` is on and a history backend is configured —
before the client gets its last byte: a JSON answer after the row is written, a stream
just before ``response.completed``. An answer that fails after its stream started is stored
as ``failed``; one whose gateway dies mid-stream is not stored at all. Either way a later
``previous_response_id`` cannot read a half answer as a finished turn
(docs/operations.md, "Stored responses").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from tandem.ascii_int import ascii_int
from tandem.errors import TandemError, make_error
from tandem.gateway.endpoints.responses.conversation_turns import append_turn
from tandem.gateway.endpoints.responses.objects import Answer, CountTokens, finished, output_items
from tandem.gateway.endpoints.responses.stream import EventWriter
from tandem.gateway.endpoints.responses.turn import Turn, history_unavailable, responses_param
from tandem.gateway.history.store import NO_TENANT, HistoryError, ResponseStore, StoredResponse
from tandem.gateway.pipeline.events import AnswerEvent
from tandem.gateway.pipeline.run import (
    Answered,
    Completed,
    Events,
    Failed,
    Inbound,
    Outcome,
    Pipeline,
    Streaming,
)
from tandem.gateway.state import GatewayState

log = logging.getLogger("tandem.gateway.endpoints.responses")

MAX_LIST_LIMIT = 100


@dataclass(slots=True)
class _StreamEnd:
    """A stream's last events, made once its answer is whole, and whether it was being
    stored (so a failure then is the store's, not the generation's)."""

    closing: list[dict[str, Any]] = field(default_factory=list)
    storing: bool = False


class ResponsesService:
    def __init__(self, state: GatewayState, pipeline: Pipeline) -> None:
        self.state = state
        self.pipeline = pipeline

    @property
    def store(self) -> ResponseStore | None:
        return self.state.history

    async def create(self, inbound: Inbound) -> Outcome:
        turn = Turn(self.store, self.state.config.history, inbound.tenant)
        bodies: list[dict[str, Any]] = []

        async def settle(completed: Completed) -> None:
            # Inside the pipeline's run: a store that fails is this request's 503 in the
            # access log and metrics, as it is for the client.
            assert turn.header is not None
            answer = Answer.from_completion(completed.answer, completed.meta.token_strings)
            body = finished(turn.header, answer, output_items(answer), await self._counter())
            await self._append(turn, body)
            await self._save(turn, body)
            bodies.append(body)

        outcome = await self.pipeline.run(inbound, "responses", turn.parse, settle)
        if isinstance(outcome, Failed):
            outcome.error.param = responses_param(outcome.error.param)
            return outcome
        if isinstance(outcome, Completed):
            return Answered(bodies[0], outcome.request_id)
        if isinstance(outcome, Events):
            assert turn.header is not None
            writer = EventWriter(turn.header, await self._counter(), outcome.meta.token_strings)
            end = _StreamEnd()

            async def before_end() -> None:
                # Run by the pipeline after the last event, as settle above.
                end.closing, body = writer.finish()
                end.storing = True
                await self._append(turn, body)
                await self._save(turn, body)

            outcome.before_end = before_end
            events = self._events(turn, outcome.events, writer, end)
            return Streaming(events, outcome.sent, outcome.request_id, named=True)
        return outcome

    async def _events(
        self,
        turn: Turn,
        answer: AsyncIterator[AnswerEvent],
        writer: EventWriter,
        end: _StreamEnd,
    ) -> AsyncGenerator[dict[str, Any], None]:
        try:
            for event in writer.start():
                yield event
            try:
                async for piece in answer:
                    for event in writer.push(piece):
                        yield event
            except TandemError as err:
                if end.storing:  # the answer was whole; keeping it failed
                    closing, _ = writer.fail(err)
                else:
                    err.param = responses_param(err.param)
                    closing, body = writer.fail(err)
                    await self._save_quietly(turn, body)
                for event in closing:
                    yield event
                return
            for event in end.closing:
                yield event
        finally:
            aclose = getattr(answer, "aclose", None)
            if aclose is not None:
                await aclose()

    async def _counter(self) -> CountTokens:
        model = await self.state.ensure_model()
        assert model is not None  # the pipeline ran with it
        return lambda text: len(model.encode(text))

    async def _save(self, turn: Turn, body: dict[str, Any]) -> None:
        if not turn.stores or self.store is None:
            return
        header = turn.header
        assert header is not None
        stored = StoredResponse(
            id=header.id,
            tenant=turn.tenant,
            previous_id=header.request.previous_response_id,
            created_at=float(header.created_at),
            status=body["status"],
            model=header.model,
            response=body,
            input_items=turn.items,
        )
        try:
            # Shielded: a client that leaves now must not cancel a write already under way.
            await asyncio.shield(self.store.put(stored))
        except HistoryError as exc:
            log.warning("response %s not stored", header.id)
            raise history_unavailable(exc) from None

    async def _append(self, turn: Turn, body: dict[str, Any]) -> None:
        """An answered turn's input and output, onto the conversation it names (before the
        response is stored: a turn the conversation refused is not stored either)."""
        if turn.conversation is None or self.store is None:
            return
        items = turn.items + list(body.get("output") or [])
        # Shielded, as _save: a client leaving must not cut an append under way.
        await asyncio.shield(append_turn(self.store, turn.tenant, turn.conversation, items))

    async def _save_quietly(self, turn: Turn, body: dict[str, Any]) -> None:
        # The client is told of the generation failure, which came first.
        with contextlib.suppress(TandemError):
            await self._save(turn, body)

    # --- stored responses ---------------------------------------------------------------

    async def retrieve(self, tenant: str | None, response_id: str) -> dict[str, Any]:
        return (await self._stored(tenant, response_id)).response

    async def delete(self, tenant: str | None, response_id: str) -> dict[str, Any]:
        store = self._store_or_refuse()
        try:
            deleted = await store.delete(tenant or NO_TENANT, response_id)
        except HistoryError as exc:
            raise history_unavailable(exc) from None
        if not deleted:
            raise _not_found(response_id)
        return {"id": response_id, "object": "response", "deleted": True}

    async def input_items(
        self, tenant: str | None, response_id: str, query: Mapping[str, str]
    ) -> dict[str, Any]:
        """One page of the response's input items (OpenAI's list shape and cursors)."""
        items = list((await self._stored(tenant, response_id)).input_items)
        limit = _int_param(query, "limit", 20, 1, MAX_LIST_LIMIT)
        order = query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise make_error("invalid_request", "order must be 'asc' or 'desc'", param="order")
        if order == "desc":
            items.reverse()
        ids = [item["id"] for item in items]
        start, end = 0, len(items)
        for cursor, name in ((query.get("after"), "after"), (query.get("before"), "before")):
            if cursor is None:
                continue
            if cursor not in ids:
                raise make_error("invalid_request", f"no input item {cursor!r}", param=name)
            if name == "after":
                start = ids.index(cursor) + 1
            else:
                end = ids.index(cursor)
        page = items[start:end][:limit]
        return {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": start + len(page) < end,
        }

    async def _stored(self, tenant: str | None, response_id: str) -> StoredResponse:
        store = self._store_or_refuse()
        try:
            stored = await store.get(tenant or NO_TENANT, response_id)
        except HistoryError as exc:
            raise history_unavailable(exc) from None
        if stored is None:
            raise _not_found(response_id)
        return stored

    def _store_or_refuse(self) -> ResponseStore:
        if self.store is None:
            raise make_error(
                "response_not_found",
                "this gateway keeps no responses (--history-backend none)",
            )
        return self.store


def _not_found(response_id: str) -> TandemError:
    # Another tenant's response reads as absent: ids are not secrets, their contents are.
    return make_error("response_not_found", f"no stored response {response_id!r}")


def _int_param(query: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = query.get(name)
    if raw is None:
        return default
    value = ascii_int(raw)
    if value is None or not low <= value <= high:
        raise make_error(
            "invalid_request", f"{name} must be an integer from {low} to {high}", param=name
        )
    return value
