"""The Conversations API over the history store.

Every call is scoped to the caller's tenant: another tenant's conversation reads as absent
(a 404, as a response id does). With ``--history-backend none`` there is nowhere to keep a
conversation, and every route answers ``conversation_not_found`` saying so, as the stored
responses' routes answer ``response_not_found`` (docs/operations.md, "Stored responses").

What a turn of ``POST /v1/responses`` does with a conversation is the Responses API's
(``endpoints/responses/conversation_turns.py``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from tandem.errors import make_error
from tandem.gateway.endpoints.conversations.objects import (
    conversation_object,
    deleted_object,
    item_list,
)
from tandem.gateway.endpoints.conversations.schema import (
    AddItems,
    CreateConversation,
    UpdateConversation,
    item_query,
    list_query,
    parse_body,
)
from tandem.gateway.endpoints.responses.conversation_turns import (
    conversation_items,
    history_unavailable,
    live_items,
    new_conversation_id,
    not_found,
    plausible_id,
    store_error,
)
from tandem.gateway.endpoints.responses.items import normalized_items
from tandem.gateway.history.store import (
    NO_TENANT,
    HistoryError,
    ResponseStore,
    StoredConversation,
)
from tandem.gateway.state import GatewayState

log = logging.getLogger("tandem.gateway.endpoints.conversations")


class ConversationsService:
    def __init__(self, state: GatewayState) -> None:
        self.state = state

    def _open(self) -> ResponseStore:
        if self.state.history is None:
            raise make_error(
                "conversation_not_found",
                "this gateway keeps no conversations (--history-backend none)",
            )
        return self.state.history

    async def _live(self, tenant: str | None, conversation_id: str) -> StoredConversation:
        store = self._open()
        if not plausible_id(conversation_id):
            raise not_found(conversation_id)
        try:
            stored = await store.get_conversation(tenant or NO_TENANT, conversation_id)
        except HistoryError as exc:
            raise history_unavailable(exc) from None
        if stored is None:
            raise not_found(conversation_id)
        return stored

    async def create(self, tenant: str | None, body: bytes) -> dict[str, Any]:
        store = self._open()
        request: CreateConversation = parse_body(CreateConversation, body)
        items = conversation_items(normalized_items(request.items or []))
        now = time.time()
        stored = StoredConversation(
            new_conversation_id(), tenant or NO_TENANT, now, now, request.metadata or {}, 0
        )
        try:
            await store.create_conversation(stored, items)
        except HistoryError as exc:
            raise store_error(exc, "items") from None
        return conversation_object(stored)

    async def retrieve(self, tenant: str | None, conversation_id: str) -> dict[str, Any]:
        return conversation_object(await self._live(tenant, conversation_id))

    async def update(self, tenant: str | None, conversation_id: str, body: bytes) -> Any:
        await self._live(tenant, conversation_id)
        request: UpdateConversation = parse_body(UpdateConversation, body)
        try:
            updated = await self._open().update_conversation(
                tenant or NO_TENANT, conversation_id, request.metadata or {}, time.time()
            )
        except HistoryError as exc:
            raise store_error(exc, "metadata") from None
        if updated is None:  # deleted or expired since
            raise not_found(conversation_id)
        return conversation_object(updated)

    async def delete(self, tenant: str | None, conversation_id: str) -> dict[str, Any]:
        store = self._open()
        if not plausible_id(conversation_id):
            raise not_found(conversation_id)
        try:
            deleted = await store.delete_conversation(tenant or NO_TENANT, conversation_id)
        except HistoryError as exc:
            raise history_unavailable(exc) from None
        if not deleted:
            raise not_found(conversation_id)
        return deleted_object(conversation_id)

    async def list_items(
        self, tenant: str | None, conversation_id: str, query: Mapping[str, Any]
    ) -> dict[str, Any]:
        store = self._open()
        wanted = list_query(query)
        items = await live_items(store, tenant or NO_TENANT, conversation_id)
        if wanted.order == "desc":
            items.reverse()
        start = 0
        if wanted.after is not None:
            ids = [item["id"] for item in items]
            if wanted.after not in ids:
                raise make_error(
                    "invalid_request",
                    f"no item {wanted.after!r} in {conversation_id}",
                    param="after",
                )
            start = ids.index(wanted.after) + 1
        page = items[start : start + wanted.limit]
        return item_list(page, start + len(page) < len(items))

    async def add_items(
        self, tenant: str | None, conversation_id: str, body: bytes, query: Mapping[str, Any]
    ) -> dict[str, Any]:
        item_query(query)
        await self._live(tenant, conversation_id)
        request: AddItems = parse_body(AddItems, body)
        items = conversation_items(normalized_items(request.items))
        try:
            added = await self._open().add_items(
                tenant or NO_TENANT, conversation_id, items, time.time()
            )
        except HistoryError as exc:
            raise store_error(exc, "items") from None
        if not added:
            raise not_found(conversation_id)
        return item_list(items, False)

    async def get_item(
        self, tenant: str | None, conversation_id: str, item_id: str, query: Mapping[str, Any]
    ) -> dict[str, Any]:
        item_query(query)
        await self._live(tenant, conversation_id)
        try:
            item = await self._open().get_item(tenant or NO_TENANT, conversation_id, item_id)
        except HistoryError as exc:
            raise history_unavailable(exc) from None
        if item is None:
            raise make_error(
                "conversation_not_found", f"no item {item_id!r} in conversation {conversation_id}"
            )
        return item

    async def delete_item(
        self, tenant: str | None, conversation_id: str, item_id: str
    ) -> dict[str, Any]:
        await self._live(tenant, conversation_id)
        store = self._open()
        try:
            deleted = await store.delete_item(
                tenant or NO_TENANT, conversation_id, item_id, time.time()
            )
        except HistoryError as exc:
            raise history_unavailable(exc) from None
        if not deleted:
            raise make_error(
                "conversation_not_found", f"no item {item_id!r} in conversation {conversation_id}"
            )
        return conversation_object(await self._live(tenant, conversation_id))
