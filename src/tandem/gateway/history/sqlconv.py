"""The conversation statements both SQL backends run, and what they share around them.

Parameters are numbered (``{p}1``): SQLite spells them ``?1``, PostgreSQL ``$1``, so one
text serves both (:func:`spelled`). A conversation's row carries its age (``updated_at``)
and its bytes (``size_bytes``: metadata and items), kept current by every change, so the
retention sweeps rank it beside the responses without summing its items (sqlrows.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tandem.gateway.history.codec import decoded, encoded
from tandem.gateway.history.migrations import CONVERSATIONS, ITEMS
from tandem.gateway.history.store import DuplicateItem, StoredConversation

_CONV_COLUMNS = "tenant, id, created_at, updated_at, metadata, size_bytes"


@dataclass(frozen=True, slots=True)
class ConversationSql:
    insert: str
    get: str
    lock: str  # the live row's size and metadata, locked for the change that follows
    item_ids: str
    next_seq: str
    insert_item: str
    touch: str
    set_metadata: str
    delete: str
    delete_items_of: str
    items: str
    get_item: str
    item_size: str
    delete_item: str
    expire: str
    orphans: str


def spelled(mark: str, lock_suffix: str = "") -> ConversationSql:
    """The statements with parameters as ``mark`` + number; ``lock_suffix`` ends the lock
    read (PostgreSQL's ``FOR UPDATE``; SQLite's ``BEGIN IMMEDIATE`` locks already)."""
    p = mark
    live = f"tenant = {p}1 AND id = {p}2 AND updated_at >= {p}3"
    of = f"tenant = {p}1 AND conversation_id = {p}2"
    return ConversationSql(
        insert=f"INSERT INTO {CONVERSATIONS} ({_CONV_COLUMNS}) VALUES "
        f"({p}1, {p}2, {p}3, {p}4, {p}5, {p}6)",
        get=f"SELECT {_CONV_COLUMNS} FROM {CONVERSATIONS} WHERE {live}",
        lock=f"SELECT size_bytes, metadata FROM {CONVERSATIONS} WHERE {live}{lock_suffix}",
        item_ids=f"SELECT id FROM {ITEMS} WHERE {of}",
        next_seq=f"SELECT COALESCE(MAX(seq), -1) + 1 FROM {ITEMS} WHERE {of}",
        insert_item=f"INSERT INTO {ITEMS} (tenant, conversation_id, seq, id, item, size_bytes) "
        f"VALUES ({p}1, {p}2, {p}3, {p}4, {p}5, {p}6)",
        touch=f"UPDATE {CONVERSATIONS} SET size_bytes = {p}3, updated_at = {p}4 "
        f"WHERE tenant = {p}1 AND id = {p}2",
        set_metadata=f"UPDATE {CONVERSATIONS} SET metadata = {p}3, size_bytes = {p}4, "
        f"updated_at = {p}5 WHERE tenant = {p}1 AND id = {p}2",
        delete=f"DELETE FROM {CONVERSATIONS} WHERE {live}",
        delete_items_of=f"DELETE FROM {ITEMS} WHERE {of}",
        items=f"SELECT item FROM {ITEMS} WHERE {of} ORDER BY seq",
        get_item=f"SELECT i.item FROM {ITEMS} AS i JOIN {CONVERSATIONS} AS c "
        "ON c.tenant = i.tenant AND c.id = i.conversation_id "
        f"WHERE i.tenant = {p}1 AND i.conversation_id = {p}2 AND i.id = {p}3 "
        f"AND c.updated_at >= {p}4",
        item_size=f"SELECT size_bytes FROM {ITEMS} WHERE {of} AND id = {p}3",
        delete_item=f"DELETE FROM {ITEMS} WHERE {of} AND id = {p}3",
        expire=f"DELETE FROM {CONVERSATIONS} WHERE updated_at < {p}1",
        # Items whose conversation is gone (deleted with it, expired or evicted).
        orphans=f"DELETE FROM {ITEMS} WHERE NOT EXISTS (SELECT 1 FROM {CONVERSATIONS} AS c "
        f"WHERE c.tenant = {ITEMS}.tenant AND c.id = {ITEMS}.conversation_id)",
    )


def conversation_from_row(row: Sequence[Any]) -> StoredConversation:
    tenant, conversation_id, created_at, updated_at, metadata, size_bytes = row[:6]
    return StoredConversation(
        id=conversation_id,
        tenant=tenant,
        created_at=float(created_at),
        updated_at=float(updated_at),
        metadata=decoded(metadata),
        size_bytes=int(size_bytes),
    )


def encoded_items(items: list[dict[str, Any]], taken: set[str]) -> list[tuple[str, str, int]]:
    """(id, text, bytes) of each item; :class:`DuplicateItem` for an id in ``taken`` or
    repeated in ``items``."""
    rows: list[tuple[str, str, int]] = []
    seen = set(taken)
    for item in items:
        item_id = item["id"]
        if item_id in seen:
            raise DuplicateItem(item_id)
        seen.add(item_id)
        data = encoded(item)
        rows.append((item_id, data.decode("utf-8"), len(data)))
    return rows
