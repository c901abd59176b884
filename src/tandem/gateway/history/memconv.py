"""The memory store's conversations (``--history-backend memory``; contract in store.py).

A conversation is one retention row, keyed like a response by (tenant, id) in the same age
index, so the caps weigh a tenant's conversations and responses together and evict the
oldest of either kind first. Each change re-indexes it under its new age and size, the
way the SQL backends keep ``updated_at`` and ``size_bytes`` on the conversation's row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from tandem.gateway.history.codec import decoded, encoded
from tandem.gateway.history.memindex import AgeIndex, Key
from tandem.gateway.history.retention import check_conversation_size, expiry_cutoff
from tandem.gateway.history.store import DuplicateItem, HistoryLimits, StoredConversation


@dataclass(slots=True)
class Conversation:
    id: str
    tenant: str
    created_at: float
    updated_at: float
    metadata: bytes
    items: dict[str, bytes] = field(default_factory=dict)  # id → item, in insertion order

    @property
    def size(self) -> int:
        return len(self.metadata) + sum(len(item) for item in self.items.values())

    def stored(self) -> StoredConversation:
        return StoredConversation(
            self.id,
            self.tenant,
            self.created_at,
            self.updated_at,
            decoded(self.metadata),
            self.size,
        )


def _encoded_items(items: Iterable[dict[str, Any]]) -> dict[str, bytes]:
    return {item["id"]: encoded(item) for item in items}


class MemoryConversations:
    """Mixed into MemoryStore, which provides the attributes declared here."""

    limits: HistoryLimits
    _clock: Callable[[], float]
    _ages: AgeIndex
    _conversations: dict[Key, Conversation]

    def _evict(self, tenants: Iterable[str], keep: Key | None) -> int:
        raise NotImplementedError  # MemoryStore's own

    def _live_conversation(self, tenant: str, conversation_id: str) -> Conversation | None:
        conversation = self._conversations.get((tenant, conversation_id))
        cutoff = expiry_cutoff(self.limits, self._clock())
        if conversation is None or conversation.updated_at < cutoff:
            return None
        return conversation

    def _reindex(self, conversation: Conversation) -> None:
        key = (conversation.tenant, conversation.id)
        self._ages.add(key, conversation.updated_at, conversation.size)
        self._evict((conversation.tenant,), keep=key)

    async def create_conversation(
        self, conversation: StoredConversation, items: list[dict[str, Any]]
    ) -> None:
        encoded_items = _encoded_items(items)
        if len(encoded_items) != len(items):
            raise DuplicateItem(_first_repeat([item["id"] for item in items]))
        row = Conversation(
            conversation.id,
            conversation.tenant,
            conversation.created_at,
            conversation.updated_at,
            encoded(conversation.metadata),
            encoded_items,
        )
        check_conversation_size(row.size, self.limits)
        self._conversations[(row.tenant, row.id)] = row
        self._reindex(row)

    async def get_conversation(
        self, tenant: str, conversation_id: str
    ) -> StoredConversation | None:
        row = self._live_conversation(tenant, conversation_id)
        return row.stored() if row is not None else None

    async def update_conversation(
        self, tenant: str, conversation_id: str, metadata: dict[str, str], now: float
    ) -> StoredConversation | None:
        row = self._live_conversation(tenant, conversation_id)
        if row is None:
            return None
        new_metadata = encoded(metadata)
        check_conversation_size(row.size - len(row.metadata) + len(new_metadata), self.limits)
        row.metadata, row.updated_at = new_metadata, now
        self._reindex(row)
        return row.stored()

    async def delete_conversation(self, tenant: str, conversation_id: str) -> bool:
        if self._live_conversation(tenant, conversation_id) is None:
            return False
        del self._conversations[(tenant, conversation_id)]
        self._ages.discard((tenant, conversation_id))
        return True

    async def add_items(
        self, tenant: str, conversation_id: str, items: list[dict[str, Any]], now: float
    ) -> bool:
        row = self._live_conversation(tenant, conversation_id)
        if row is None:
            return False
        ids = [item["id"] for item in items]
        taken = [item_id for item_id in ids if item_id in row.items]
        if taken or len(set(ids)) != len(ids):
            raise DuplicateItem(taken[0] if taken else _first_repeat(ids))
        new = _encoded_items(items)
        check_conversation_size(row.size + sum(len(item) for item in new.values()), self.limits)
        row.items.update(new)
        row.updated_at = now
        self._reindex(row)
        return True

    async def conversation_items(
        self, tenant: str, conversation_id: str
    ) -> list[dict[str, Any]] | None:
        row = self._live_conversation(tenant, conversation_id)
        return [decoded(item) for item in row.items.values()] if row is not None else None

    async def get_item(
        self, tenant: str, conversation_id: str, item_id: str
    ) -> dict[str, Any] | None:
        row = self._live_conversation(tenant, conversation_id)
        item = row.items.get(item_id) if row is not None else None
        return decoded(item) if item is not None else None

    async def delete_item(
        self, tenant: str, conversation_id: str, item_id: str, now: float
    ) -> bool:
        row = self._live_conversation(tenant, conversation_id)
        if row is None or row.items.pop(item_id, None) is None:
            return False
        row.updated_at = now
        self._reindex(row)
        return True


def _first_repeat(ids: list[str]) -> str:
    seen: set[str] = set()
    for item_id in ids:
        if item_id in seen:
            return item_id
        seen.add(item_id)
    return ids[0]
