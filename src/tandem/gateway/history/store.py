"""The stored-responses contract every history backend keeps (memory, SQLite, PostgreSQL).

A stored response is one turn of a Responses API conversation: the input items the client
sent for that turn and the Response object the gateway answered, linked to the turn before
it by ``previous_id``. A conversation is read back by walking those links (:meth:`chain`).

A stored conversation (the Conversations API, ``/v1/conversations``) is the other kind of
row: metadata and an ordered list of items, appended to by the items routes and by each
``POST /v1/responses`` that names it. For retention it is one row: its bytes are its
metadata and all its items, its age is its last change (``updated_at``), and it goes whole,
items and all, from the same TTL, per-tenant and total sweeps as the responses.

Rules all backends share (``tests/unit/gateway/history`` checks each against them):
- ``put`` returns only once the row is durable (committed; SQLite with ``synchronous=FULL``);
- every read and delete is scoped to a tenant: another tenant's id reads as absent;
- a row is never half-written: ``put`` is one transaction;
- retention (``HistoryLimits``) deletes whole rows, oldest first: first those of a tenant
  over its own cap, then any while all rows are over the total cap; a row older than
  ``ttl_s`` already reads as absent before the sweeper deletes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

# The tenant of requests made without tenant keys (--api-key or no key at all).
NO_TENANT = ""


class HistoryError(Exception):
    """The backend failed (unreachable database, disk full, corrupt file)."""


class ResponseTooLarge(HistoryError):
    """One response is over ``HistoryLimits.max_response_bytes`` (or its tenant's cap)."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"the response would take {size} bytes to store; the limit is {limit}")
        self.size = size
        self.limit = limit


class BrokenChain(HistoryError):
    """An earlier turn of the conversation is gone (deleted or expired)."""

    def __init__(self, missing_id: str) -> None:
        super().__init__(f"earlier response {missing_id!r} of this conversation is gone")
        self.missing_id = missing_id


class ConversationTooLarge(ResponseTooLarge):
    """A conversation would grow over the largest row a store keeps (``check_size``)."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(size, limit)
        self.args = (f"the conversation would take {size} bytes to store; the limit is {limit}",)


class DuplicateItem(HistoryError):
    """An item id the conversation already holds (ids are unique within a conversation)."""

    def __init__(self, item_id: str) -> None:
        super().__init__(f"the conversation already has an item {item_id!r}")
        self.item_id = item_id


class ChainTooLong(HistoryError):
    """The conversation has more turns than ``HistoryLimits.max_turns``."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the conversation is longer than {limit} turns")
        self.limit = limit


@dataclass(frozen=True, slots=True)
class HistoryLimits:
    """How much is kept, and for how long (docs/operations.md, "Stored responses")."""

    ttl_s: float | None = 30 * 24 * 3600.0  # None: kept until deleted
    max_total_bytes: int = 1 << 30  # all rows together; the oldest go first (0: no cap)
    # One tenant's rows; over it, that tenant's oldest go first, so that one tenant's large
    # responses never push out another's conversations. None: an even share of
    # max_total_bytes per tenant the keys name (settings.with_tenant_share, applied by the
    # factory); a store given None has no per-tenant cap. 0: no per-tenant cap.
    max_tenant_bytes: int | None = None
    max_response_bytes: int = 32 << 20  # one row (its images included)
    max_turns: int = 100  # the longest chain previous_response_id may continue
    sweep_interval_s: float = 60.0


@dataclass(frozen=True, slots=True)
class StoredResponse:
    id: str
    tenant: str  # NO_TENANT without tenant keys
    previous_id: str | None
    created_at: float  # unix seconds
    status: str  # "completed" | "incomplete" | "failed"
    model: str
    response: dict[str, Any]  # the Response object as the client got it
    input_items: list[dict[str, Any]]  # this turn's input items, each with an "id"

    def size(self) -> int:
        """Bytes the row takes, as retention counts them (the two JSON documents)."""
        from tandem.gateway.history.codec import encoded

        return len(encoded(self.response)) + len(encoded(self.input_items))


@dataclass(frozen=True, slots=True)
class StoredConversation:
    id: str
    tenant: str  # NO_TENANT without tenant keys
    created_at: float  # unix seconds
    updated_at: float  # the last change (items added or deleted, metadata): its age
    metadata: dict[str, str]
    size_bytes: int  # the metadata and every item, as retention counts them


class ResponseStore(Protocol):
    """A history backend. All methods are coroutines safe to call concurrently."""

    @property
    def name(self) -> str:
        """ "memory", "sqlite" or "postgres" (logs, /health)."""
        ...

    async def start(self) -> None:
        """Connect, create or migrate the schema, start the retention sweeper."""
        ...

    async def close(self) -> None: ...

    async def put(self, item: StoredResponse) -> None:
        """Store one response (insert; an existing id is replaced). Durable on return.

        Raises :class:`ResponseTooLarge` (nothing stored) or :class:`HistoryError`.
        """
        ...

    async def get(self, tenant: str, response_id: str) -> StoredResponse | None: ...

    async def chain(self, tenant: str, response_id: str) -> list[StoredResponse] | None:
        """The conversation ending at ``response_id``, oldest turn first.

        None when ``response_id`` itself is absent (or another tenant's);
        :class:`BrokenChain` when an earlier turn is gone; :class:`ChainTooLong` past
        ``max_turns``.
        """
        ...

    async def delete(self, tenant: str, response_id: str) -> bool:
        """Delete one response; False when absent. Later turns keep their rows."""
        ...

    async def sweep(self) -> int:
        """Apply retention now (the sweeper does so at start and every sweep interval).

        Deletes the rows older than ``ttl_s``, then each tenant's oldest rows while that
        tenant's are over ``max_tenant_bytes``, then the oldest rows while all of them
        together are over ``max_total_bytes``; returns how many rows went (a conversation
        counts as one row, its items with it).
        """
        ...

    # --- conversations (reads and deletes tenant-scoped and TTL-bound, as above) ---------

    async def create_conversation(
        self, conversation: StoredConversation, items: list[dict[str, Any]]
    ) -> None:
        """Store a new conversation with its first items (each with a unique "id"), in one
        transaction; ``conversation.size_bytes`` is ignored (the store counts).

        Raises :class:`ConversationTooLarge` (nothing stored) or :class:`HistoryError`.
        """
        ...

    async def get_conversation(
        self, tenant: str, conversation_id: str
    ) -> StoredConversation | None: ...

    async def update_conversation(
        self, tenant: str, conversation_id: str, metadata: dict[str, str], now: float
    ) -> StoredConversation | None:
        """Replace the metadata; None when the conversation is absent."""
        ...

    async def delete_conversation(self, tenant: str, conversation_id: str) -> bool:
        """Delete the conversation and all its items; False when absent."""
        ...

    async def add_items(
        self, tenant: str, conversation_id: str, items: list[dict[str, Any]], now: float
    ) -> bool:
        """Append items after the last one, all or none; False when the conversation is
        absent. Raises :class:`DuplicateItem` for an id it holds already,
        :class:`ConversationTooLarge` when it would grow over the row limit."""
        ...

    async def conversation_items(
        self, tenant: str, conversation_id: str
    ) -> list[dict[str, Any]] | None:
        """Every item, oldest first; None when the conversation is absent."""
        ...

    async def get_item(
        self, tenant: str, conversation_id: str, item_id: str
    ) -> dict[str, Any] | None: ...

    async def delete_item(
        self, tenant: str, conversation_id: str, item_id: str, now: float
    ) -> bool:
        """Delete one item; False when it (or its conversation) is absent."""
        ...
