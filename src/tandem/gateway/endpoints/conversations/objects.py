"""The Conversations API's objects in OpenAI's shapes, and the ids it makes."""

from __future__ import annotations

from typing import Any

from tandem.gateway.history.store import StoredConversation


def conversation_object(stored: StoredConversation) -> dict[str, Any]:
    return {
        "id": stored.id,
        "object": "conversation",
        "created_at": int(stored.created_at),
        "metadata": stored.metadata,
    }


def deleted_object(conversation_id: str) -> dict[str, Any]:
    return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}


def item_list(page: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": has_more,
    }
