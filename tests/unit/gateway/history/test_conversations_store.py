"""The conversations half of the history contract (gateway/history/store.py), on every
backend: memory, SQLite and PostgreSQL (fixtures in conftest.py, a fake clock for TTLs).

Conversations and their items, tenant-scoped; all-or-none appends; the row's size kept as
its metadata plus its items; and retention treating a conversation as one row beside the
responses (the same TTL, per-tenant and total caps, items going with it).
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from history_fakes import T0, Clock, MakeStore, turn

from tandem.gateway.history.codec import encoded
from tandem.gateway.history.memory import MemoryStore
from tandem.gateway.history.migrations import LATEST
from tandem.gateway.history.sqlite import SqliteStore
from tandem.gateway.history.store import (
    NO_TENANT,
    ConversationTooLarge,
    DuplicateItem,
    HistoryLimits,
    ResponseStore,
    StoredConversation,
)


def conversation(
    conversation_id: str,
    tenant: str = NO_TENANT,
    at: float = T0,
    metadata: dict[str, str] | None = None,
) -> StoredConversation:
    return StoredConversation(conversation_id, tenant, at, at, metadata or {}, 0)


def message(item_id: str, text: str = "hello") -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id,
        "role": "user",
        "status": "completed",
        "content": [{"type": "input_text", "text": text}],
    }


def size_of(metadata: dict[str, str], *items: dict[str, Any]) -> int:
    return len(encoded(metadata)) + sum(len(encoded(item)) for item in items)


async def ids(store: ResponseStore, conversation_id: str, tenant: str = NO_TENANT) -> Any:
    items = await store.conversation_items(tenant, conversation_id)
    return None if items is None else [item["id"] for item in items]


async def test_create_then_read_back_items_in_order(make_store: MakeStore) -> None:
    store = await make_store()
    first = [message("msg_1", "héllo 😀 \x00 \ud800"), message("msg_2")]
    await store.create_conversation(conversation("conv_a", metadata={"k": "v"}), first)
    got = await store.get_conversation(NO_TENANT, "conv_a")
    assert got == StoredConversation(
        "conv_a", NO_TENANT, T0, T0, {"k": "v"}, size_of({"k": "v"}, *first)
    )
    assert await store.conversation_items(NO_TENANT, "conv_a") == first
    assert await store.add_items(NO_TENANT, "conv_a", [message("msg_3")], T0 + 5) is True
    assert await ids(store, "conv_a") == ["msg_1", "msg_2", "msg_3"]
    grown = await store.get_conversation(NO_TENANT, "conv_a")
    assert grown is not None and grown.updated_at == T0 + 5 and grown.created_at == T0
    assert grown.size_bytes == size_of({"k": "v"}, *first, message("msg_3"))
    assert await store.get_item(NO_TENANT, "conv_a", "msg_2") == message("msg_2")
    assert await store.get_item(NO_TENANT, "conv_a", "msg_9") is None
    assert await store.get_conversation(NO_TENANT, "conv_missing") is None
    assert await store.conversation_items(NO_TENANT, "conv_missing") is None


async def test_another_tenants_conversation_is_absent(make_store: MakeStore) -> None:
    store = await make_store()
    await store.create_conversation(conversation("conv_a", tenant="alice"), [message("m1")])
    assert await store.get_conversation("bob", "conv_a") is None
    assert await store.conversation_items("bob", "conv_a") is None
    assert await store.get_item("bob", "conv_a", "m1") is None
    assert await store.add_items("bob", "conv_a", [message("m2")], T0) is False
    assert await store.update_conversation("bob", "conv_a", {"x": "y"}, T0) is None
    assert await store.delete_item("bob", "conv_a", "m1", T0) is False
    assert await store.delete_conversation("bob", "conv_a") is False
    assert await ids(store, "conv_a", "alice") == ["m1"]  # bob touched nothing
    got = await store.get_conversation("alice", "conv_a")
    assert got is not None and got.metadata == {}


async def test_update_metadata_and_delete_items(make_store: MakeStore) -> None:
    store = await make_store()
    items = [message("m1"), message("m2"), message("m3")]
    await store.create_conversation(conversation("conv_a", metadata={"a": "1"}), items)
    updated = await store.update_conversation(NO_TENANT, "conv_a", {"b": "22"}, T0 + 1)
    assert updated is not None and updated.metadata == {"b": "22"}
    assert updated.size_bytes == size_of({"b": "22"}, *items)
    assert await store.delete_item(NO_TENANT, "conv_a", "m2", T0 + 2) is True
    assert await store.delete_item(NO_TENANT, "conv_a", "m2", T0 + 2) is False
    assert await ids(store, "conv_a") == ["m1", "m3"]
    after = await store.get_conversation(NO_TENANT, "conv_a")
    assert after is not None and after.size_bytes == size_of({"b": "22"}, items[0], items[2])
    # Appended after a deletion: still after the last item, never in the gap.
    await store.add_items(NO_TENANT, "conv_a", [message("m4")], T0 + 3)
    assert await ids(store, "conv_a") == ["m1", "m3", "m4"]
    assert await store.delete_conversation(NO_TENANT, "conv_a") is True
    assert await store.get_conversation(NO_TENANT, "conv_a") is None
    assert await store.get_item(NO_TENANT, "conv_a", "m1") is None
    assert await store.delete_conversation(NO_TENANT, "conv_a") is False


async def test_a_duplicate_item_id_refuses_the_whole_batch(make_store: MakeStore) -> None:
    store = await make_store()
    await store.create_conversation(conversation("conv_a"), [message("m1")])
    with pytest.raises(DuplicateItem) as caught:
        await store.add_items(NO_TENANT, "conv_a", [message("m2"), message("m1")], T0)
    assert caught.value.item_id == "m1"
    with pytest.raises(DuplicateItem):
        await store.add_items(NO_TENANT, "conv_a", [message("m5"), message("m5")], T0)
    assert await ids(store, "conv_a") == ["m1"]  # m2 and m5 not added either
    with pytest.raises(DuplicateItem):
        await store.create_conversation(conversation("conv_b"), [message("x"), message("x")])
    assert await store.get_conversation(NO_TENANT, "conv_b") is None


async def test_concurrent_appends_all_land_once_and_in_one_order(make_store: MakeStore) -> None:
    store = await make_store()
    await store.create_conversation(conversation("conv_a"), [])
    batches = [[message(f"m{i}a"), message(f"m{i}b")] for i in range(8)]
    await asyncio.gather(*(store.add_items(NO_TENANT, "conv_a", b, T0) for b in batches))
    got = await ids(store, "conv_a")
    assert sorted(got) == sorted(item["id"] for batch in batches for item in batch)
    for i in range(8):  # a batch is never split by another one
        assert got.index(f"m{i}b") == got.index(f"m{i}a") + 1
    grown = await store.get_conversation(NO_TENANT, "conv_a")
    assert grown is not None
    assert grown.size_bytes == size_of({}, *(item for batch in batches for item in batch))


async def test_a_conversation_never_grows_over_the_row_limit(make_store: MakeStore) -> None:
    one = size_of({}, message("m1"))
    store = await make_store(HistoryLimits(max_response_bytes=2 * one + 5))
    await store.create_conversation(conversation("conv_a"), [message("m1")])
    await store.add_items(NO_TENANT, "conv_a", [message("m2")], T0)
    with pytest.raises(ConversationTooLarge):
        await store.add_items(NO_TENANT, "conv_a", [message("m3")], T0)
    assert await ids(store, "conv_a") == ["m1", "m2"]
    with pytest.raises(ConversationTooLarge):
        await store.update_conversation(NO_TENANT, "conv_a", {"k": "v" * 50}, T0)
    with pytest.raises(ConversationTooLarge):
        items = [message("a"), message("b"), message("c")]
        await store.create_conversation(conversation("conv_big"), items)
    assert await store.get_conversation(NO_TENANT, "conv_big") is None


async def test_a_conversation_expires_from_its_last_change(make_store: MakeStore) -> None:
    clock = Clock()
    store = await make_store(HistoryLimits(ttl_s=100.0), clock)
    await store.create_conversation(conversation("conv_idle"), [message("m1")])
    await store.create_conversation(conversation("conv_busy"), [message("m1")])
    clock.now = T0 + 90
    await store.add_items(NO_TENANT, "conv_busy", [message("m2")], clock.now)
    clock.now = T0 + 101  # idle: 101 s since its last change; busy: 11 s
    assert await store.get_conversation(NO_TENANT, "conv_idle") is None
    assert await store.conversation_items(NO_TENANT, "conv_idle") is None
    assert await store.add_items(NO_TENANT, "conv_idle", [message("m2")], clock.now) is False
    assert await ids(store, "conv_busy") == ["m1", "m2"]
    assert await store.sweep() == 1  # one conversation, its item with it
    clock.now = T0 + 191
    assert await store.sweep() == 1
    assert await store.get_conversation(NO_TENANT, "conv_busy") is None


async def test_total_cap_weighs_conversations_and_responses_together(
    backend: str, make_store: MakeStore
) -> None:
    """Oldest first, of either kind; a conversation goes whole, its items with it."""
    row = turn("r0")
    unit = row.size()
    # A conversation of about one response's bytes (the caps are counted, not exact).
    items = [message("m1", "x" * max(1, unit - size_of({}, message("m1", ""))))]
    conv_size = size_of({}, *items)
    limits = HistoryLimits(
        max_total_bytes=2 * unit + conv_size, max_response_bytes=conv_size + unit
    )
    store = await make_store(limits)
    await store.put(turn("r_old", created_at=T0))
    await store.create_conversation(conversation("conv_mid", at=T0 + 1), items)
    await store.put(turn("r_new", created_at=T0 + 2))
    await store.create_conversation(conversation("conv_newest", at=T0 + 3), items)
    if not isinstance(store, MemoryStore):  # the memory store evicts in the write itself
        assert await store.sweep() == 2
    assert await store.get(NO_TENANT, "r_old") is None
    assert await store.get_conversation(NO_TENANT, "conv_mid") is None
    assert await store.get(NO_TENANT, "r_new") is not None
    assert await ids(store, "conv_newest") == ["m1"]
    # A change makes a conversation young again: now r_new is the oldest row.
    await store.create_conversation(conversation("conv_c", at=T0 + 4), items)
    if not isinstance(store, MemoryStore):
        assert await store.sweep() == 1
    assert await store.get(NO_TENANT, "r_new") is None
    assert await store.get_item(NO_TENANT, "conv_mid", "m1") is None


async def test_a_tenant_over_its_cap_loses_its_own_oldest_of_either_kind(
    make_store: MakeStore,
) -> None:
    items = [message("m1", "y" * 200)]
    size = size_of({}, *items)
    store = await make_store(
        HistoryLimits(max_tenant_bytes=2 * size, max_total_bytes=0, max_response_bytes=size)
    )
    await store.create_conversation(conversation("conv_other", "bob", at=T0 - 10), items)
    for i in range(3):
        await store.create_conversation(conversation(f"conv_{i}", "alice", at=T0 + i), items)
    if not isinstance(store, MemoryStore):
        assert await store.sweep() == 1
    assert await store.get_conversation("alice", "conv_0") is None
    assert await ids(store, "conv_1", "alice") == ["m1"]
    assert await ids(store, "conv_other", "bob") == ["m1"]  # older, but bob is within his cap


async def test_sqlite_keeps_conversations_across_a_reopen_and_migrates_version_1(
    tmp_path: Path,
) -> None:
    path = tmp_path / "h.sqlite3"
    old = sqlite3.connect(path)  # a database a gateway before conversations left behind
    old.executescript(
        """
        CREATE TABLE tandem_schema_version (version INTEGER NOT NULL);
        INSERT INTO tandem_schema_version VALUES (1);
        CREATE TABLE tandem_responses (tenant TEXT NOT NULL, id TEXT NOT NULL,
            previous_id TEXT, created_at REAL NOT NULL, status TEXT NOT NULL,
            model TEXT NOT NULL, response TEXT NOT NULL, input_items TEXT NOT NULL,
            size_bytes INTEGER NOT NULL, PRIMARY KEY (tenant, id));
        INSERT INTO tandem_responses VALUES
            ('', 'resp_kept', NULL, 1.0, 'completed', 'm', '{}', '[]', 4);
        """
    )
    old.close()
    limits = HistoryLimits(ttl_s=None)
    store = SqliteStore(path, limits)
    await store.start()
    try:
        assert await store.get(NO_TENANT, "resp_kept") is not None
        await store.create_conversation(conversation("conv_a"), [message("m1")])
    finally:
        await store.close()
    reopened = SqliteStore(path, limits)
    await reopened.start()
    try:
        assert await ids(reopened, "conv_a") == ["m1"]
    finally:
        await reopened.close()
    check = sqlite3.connect(path)
    assert check.execute("SELECT version FROM tandem_schema_version").fetchall() == [(LATEST,)]
    check.close()
