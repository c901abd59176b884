"""What a turn of ``POST /v1/responses`` does with the conversation it names, and what the
Conversations API (``endpoints/conversations``) shares with it: the conversation's items
read as the context before the turn's input (:func:`conversation_context`), and, once the
turn answered, its input and output items appended (:func:`append_turn`); the ids, the
items' stored form and the coded errors. It lives on the Responses side so that the
Conversations API depends on the Responses API (its item shapes), never the reverse.
"""

from __future__ import annotations

import logging
import secrets
import time
from typing import Any

from tandem.errors import TandemError, make_error
from tandem.gateway.history.store import (
    ConversationTooLarge,
    DuplicateItem,
    HistoryError,
    ResponseStore,
)

log = logging.getLogger("tandem.gateway.endpoints.conversations")

ID_PREFIX = "conv_"
# Longer ids than this were never made here: refused before any store is asked.
MAX_ID_LENGTH = 128


def new_conversation_id() -> str:
    return ID_PREFIX + secrets.token_hex(24)


def plausible_id(conversation_id: str) -> bool:
    return conversation_id.startswith(ID_PREFIX) and len(conversation_id) <= MAX_ID_LENGTH


def history_unavailable(exc: HistoryError) -> TandemError:
    # The detail (database host, file path) is for the operator's log, not the client.
    log.warning("stored conversations unavailable: %s", exc)
    return make_error("history_unavailable", "stored conversations are unavailable; try again")


def not_found(conversation_id: str, param: str | None = None) -> TandemError:
    return make_error("conversation_not_found", f"no conversation {conversation_id!r}", param=param)


def store_error(exc: HistoryError, param: str) -> TandemError:
    """A refusal the client can act on (400 naming ``param``), else a 503."""
    if isinstance(exc, (ConversationTooLarge, DuplicateItem)):
        return make_error("invalid_request", str(exc), param=param)
    return history_unavailable(exc)


def conversation_items(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Items as a conversation keeps them: a message always has a ``status`` (OpenAI's
    conversation messages do; an input item as the Responses API stores it has none)."""
    kept = []
    for item in items:
        if item.get("type") == "message" and "status" not in item:
            item = {**item, "status": "completed"}
        kept.append(item)
    return kept


async def live_items(
    store: ResponseStore, tenant: str, conversation_id: str
) -> list[dict[str, Any]]:
    if not plausible_id(conversation_id):
        raise not_found(conversation_id)
    try:
        items = await store.conversation_items(tenant, conversation_id)
    except HistoryError as exc:
        raise history_unavailable(exc) from None
    if items is None:
        raise not_found(conversation_id)
    return items


async def conversation_context(
    store: ResponseStore | None, tenant: str, conversation_id: str
) -> list[dict[str, Any]]:
    """The conversation's items, oldest first: the context a turn naming it continues."""
    if store is None:
        raise make_error(
            "invalid_request",
            "this gateway keeps no conversations (--history-backend none)",
            param="conversation",
        )
    try:
        return await live_items(store, tenant, conversation_id)
    except TandemError as err:
        if err.code == "conversation_not_found":
            err.param = "conversation"
        raise


async def append_turn(
    store: ResponseStore, tenant: str, conversation_id: str, items: list[dict[str, Any]]
) -> None:
    """Append an answered turn's input and output items. A conversation deleted (or grown
    too large) while the turn ran is the client's to hear about: a coded error."""
    try:
        added = await store.add_items(
            tenant, conversation_id, conversation_items(items), time.time()
        )
    except HistoryError as exc:
        raise store_error(exc, "conversation") from None
    if not added:
        raise not_found(conversation_id, param="conversation")
