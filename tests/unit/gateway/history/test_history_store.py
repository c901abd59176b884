"""The stored-responses contract (gateway/history/store.py), checked on every backend.

Memory, SQLite (a file in tmp_path) and PostgreSQL (a real server of the session's own,
tests/integration/postgres_server.py; each test gets a fresh database): the fixtures are in
conftest.py. Time is a fake clock handed to the store, so TTL tests never sleep.
"""

from __future__ import annotations

import asyncio
import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from history_fakes import SQL_ONLY, T0, Clock, MakeStore, turn

from tandem.gateway.history.memory import MemoryStore
from tandem.gateway.history.migrations import LATEST, VERSION_TABLE
from tandem.gateway.history.postgres import PostgresStore
from tandem.gateway.history.sqlite import SqliteStore
from tandem.gateway.history.store import (
    NO_TENANT,
    BrokenChain,
    ChainTooLong,
    HistoryError,
    HistoryLimits,
    ResponseStore,
    ResponseTooLarge,
)


async def test_put_then_get_returns_what_was_stored(make_store: MakeStore) -> None:
    store = await make_store()
    # Non-ASCII, a NUL character and a lone surrogate (valid in a request's JSON, no UTF-8
    # form) all come back as they went in.
    item = turn("resp_1", text="héllo 😀 \x00 \ud800 end")
    await store.put(item)
    assert await store.get(NO_TENANT, "resp_1") == item
    assert await store.get(NO_TENANT, "resp_missing") is None


async def test_another_tenants_response_is_absent(make_store: MakeStore) -> None:
    store = await make_store()
    await store.put(turn("resp_a", tenant="alice"))
    assert await store.get("bob", "resp_a") is None
    assert await store.get(NO_TENANT, "resp_a") is None
    assert await store.chain("bob", "resp_a") is None
    assert await store.delete("bob", "resp_a") is False
    assert await store.get("alice", "resp_a") is not None  # bob's delete touched nothing
    # The same id under two tenants is two rows (a replace never crosses tenants).
    await store.put(turn("resp_a", tenant="bob", text="bob's"))
    alice, bob = await store.get("alice", "resp_a"), await store.get("bob", "resp_a")
    assert alice is not None and bob is not None
    assert (alice.response["output_text"], bob.response["output_text"]) == ("hello", "bob's")


async def test_chain_is_oldest_first_and_tenant_scoped(make_store: MakeStore) -> None:
    store = await make_store()
    for i, previous in ((1, None), (2, "r1"), (3, "r2")):
        await store.put(turn(f"r{i}", previous, tenant="t", created_at=T0 + i))
    # Another tenant's row under an id of this chain: the walk never steps into it.
    await store.put(turn("r1", tenant="other", text="not t's", created_at=T0 + 9))
    chain = await store.chain("t", "r3")
    assert chain is not None and [t.id for t in chain] == ["r1", "r2", "r3"]
    assert chain[0] == turn("r1", tenant="t", created_at=T0 + 1)
    first = await store.chain("t", "r1")
    assert first is not None and [t.id for t in first] == ["r1"]
    assert await store.chain("t", "nope") is None
    assert await store.chain("other", "r3") is None


async def test_a_deleted_turn_breaks_the_chain_and_leaves_later_turns(
    make_store: MakeStore,
) -> None:
    store = await make_store()
    for i, previous in ((1, None), (2, "r1"), (3, "r2")):
        await store.put(turn(f"r{i}", previous, created_at=T0 + i))
    assert await store.delete(NO_TENANT, "r2") is True
    assert await store.delete(NO_TENANT, "r2") is False
    assert await store.get(NO_TENANT, "r3") is not None
    with pytest.raises(BrokenChain) as caught:
        await store.chain(NO_TENANT, "r3")
    assert caught.value.missing_id == "r2"
    assert isinstance(caught.value, HistoryError)


async def test_chain_longer_than_max_turns(make_store: MakeStore) -> None:
    store = await make_store(HistoryLimits(max_turns=3))
    previous = None
    for i in range(1, 5):
        await store.put(turn(f"r{i}", previous, created_at=T0 + i))
        previous = f"r{i}"
    three = await store.chain(NO_TENANT, "r3")
    assert three is not None and len(three) == 3  # exactly max_turns is fine
    with pytest.raises(ChainTooLong) as caught:
        await store.chain(NO_TENANT, "r4")
    assert caught.value.limit == 3
    # At the limit with the turn before it gone, the chain is broken, not too long.
    await store.delete(NO_TENANT, "r1")
    with pytest.raises(BrokenChain):
        await store.chain(NO_TENANT, "r4")


async def test_put_replaces_a_response_with_the_same_id(make_store: MakeStore) -> None:
    store = await make_store()
    await store.put(turn("r1", status="incomplete", text="partial"))
    final = turn("r1", status="completed", text="whole answer")
    await store.put(final)
    assert await store.get(NO_TENANT, "r1") == final
    chain = await store.chain(NO_TENANT, "r1")
    assert chain == [final]


async def test_a_response_over_the_limit_is_refused_and_not_stored(
    make_store: MakeStore,
) -> None:
    small = turn("r_small")
    limit = small.size() + 10
    store = await make_store(HistoryLimits(max_response_bytes=limit))
    await store.put(small)
    big = turn("r_big", text="x" * 200)
    with pytest.raises(ResponseTooLarge) as caught:
        await store.put(big)
    assert (caught.value.size, caught.value.limit) == (big.size(), limit)
    assert await store.get(NO_TENANT, "r_big") is None
    # A replace that grows over the limit leaves the old row as it was.
    with pytest.raises(ResponseTooLarge):
        await store.put(replace(big, id="r_small"))
    assert await store.get(NO_TENANT, "r_small") == small


async def test_expired_responses_read_as_absent_then_are_swept(make_store: MakeStore) -> None:
    clock = Clock()
    store = await make_store(HistoryLimits(ttl_s=100.0), clock)
    await store.put(turn("r1", created_at=T0))
    await store.put(turn("r2", "r1", created_at=T0 + 50))
    clock.now = T0 + 99
    chain = await store.chain(NO_TENANT, "r2")
    assert chain is not None and len(chain) == 2
    clock.now = T0 + 101  # r1 expired, r2 not yet
    assert await store.get(NO_TENANT, "r1") is None
    assert await store.delete(NO_TENANT, "r1") is False
    with pytest.raises(BrokenChain):
        await store.chain(NO_TENANT, "r2")
    assert await store.sweep() == 1
    clock.now = T0 + 151
    assert await store.get(NO_TENANT, "r2") is None
    assert await store.sweep() == 1
    assert await store.sweep() == 0


async def test_no_ttl_keeps_responses(make_store: MakeStore) -> None:
    clock = Clock()
    store = await make_store(HistoryLimits(ttl_s=None), clock)
    await store.put(turn("r1"))
    clock.now = T0 + 10 * 365 * 86400
    assert await store.get(NO_TENANT, "r1") is not None
    assert await store.sweep() == 0


@SQL_ONLY
async def test_size_cap_evicts_the_oldest_first(backend: str, make_store: MakeStore) -> None:
    """At the sweep. The memory store applies its caps in put itself, never to the row it
    stores (test_history_tenant_caps.py)."""
    rows = [turn(f"r{i}", created_at=T0 + i) for i in range(5)]
    size = rows[0].size()
    assert all(r.size() == size for r in rows)
    store = await make_store(HistoryLimits(max_total_bytes=3 * size, max_response_bytes=size))
    for row in reversed(rows):  # written newest first: age, not write order, decides
        await store.put(row)
    assert await store.sweep() == 2
    kept = [r.id for r in rows if await store.get(NO_TENANT, r.id) is not None]
    assert kept == ["r2", "r3", "r4"]
    assert await store.sweep() == 0


async def test_the_sweeper_runs_at_start_and_periodically_until_closed(
    make_store: MakeStore,
) -> None:
    clock = Clock()
    limits = HistoryLimits(ttl_s=100.0, sweep_interval_s=0.02)
    store = await make_store(limits, clock, start=False)
    if isinstance(store, MemoryStore):
        await store.put(turn("old", created_at=T0 - 200))
    else:  # rows already in the file or database when the gateway starts
        writer = await make_store(HistoryLimits(ttl_s=None))
        await writer.put(turn("old", created_at=T0 - 200))
        await writer.close()
    await store.start()
    # Swept by start() itself: no waiting for the first interval.
    assert await make_store_rows(store) == 0
    await store.put(turn("young", created_at=T0))
    clock.now = T0 + 101
    for _ in range(200):
        if await make_store_rows(store) == 0:
            break
        await asyncio.sleep(0.01)
    assert await make_store_rows(store) == 0
    await store.close()
    await store.close()  # idempotent


async def make_store_rows(store: ResponseStore) -> int:
    """Rows in the store, expired or not (sweeping with an infinite TTL counts nothing)."""
    if isinstance(store, MemoryStore):
        return len(store._rows)
    if isinstance(store, SqliteStore):
        with sqlite3.connect(store.path) as conn:
            return int(conn.execute("SELECT COUNT(*) FROM tandem_responses").fetchone()[0])
    assert isinstance(store, PostgresStore)
    return int(await store._pool.fetchval("SELECT COUNT(*) FROM tandem_responses"))


async def test_fifty_concurrent_puts_all_land(make_store: MakeStore) -> None:
    store = await make_store()
    items = [turn(f"r{i}", tenant=f"t{i % 3}", text=f"answer {i}") for i in range(50)]
    await asyncio.gather(*(store.put(item) for item in items))
    got = await asyncio.gather(*(store.get(item.tenant, item.id) for item in items))
    assert got == items


@SQL_ONLY
async def test_a_reopened_store_sees_what_an_earlier_one_wrote(
    backend: str, make_store: MakeStore
) -> None:
    first = await make_store()
    await first.put(turn("r1"))
    await first.close()  # the gateway stopped (or died: put returned after the commit)
    second = await make_store()
    assert await second.get(NO_TENANT, "r1") == turn("r1")


@SQL_ONLY
async def test_two_stores_at_once_share_rows(backend: str, make_store: MakeStore) -> None:
    """Two pools (PostgreSQL) or two connections (SQLite) on one database: two gateways."""
    a, b = await make_store(), await make_store()
    await a.put(turn("r1"))
    await b.put(turn("r2", "r1"))
    chain = await a.chain(NO_TENANT, "r2")
    assert chain is not None and [t.id for t in chain] == ["r1", "r2"]
    assert await b.delete(NO_TENANT, "r1") is True
    assert await a.get(NO_TENANT, "r1") is None


@SQL_ONLY
async def test_migration_is_idempotent_and_safe_when_concurrent(
    backend: str, make_store: MakeStore
) -> None:
    first = await make_store()
    await first.put(turn("r1"))
    await first.close()
    # Started again, and four at once: each finds the schema done or waits for the lock.
    stores = [await make_store(start=False) for _ in range(4)]
    await asyncio.gather(*(s.start() for s in stores))
    assert await stores[0].get(NO_TENANT, "r1") == turn("r1")
    assert await schema_versions(stores[0]) == [LATEST]


@SQL_ONLY
async def test_concurrent_first_start_creates_the_schema_once(
    backend: str, make_store: MakeStore
) -> None:
    stores = [await make_store(start=False) for _ in range(4)]
    await asyncio.gather(*(s.start() for s in stores))
    await stores[1].put(turn("r1"))
    assert await stores[2].get(NO_TENANT, "r1") is not None
    assert await schema_versions(stores[0]) == [LATEST]


async def test_gateways_starting_together_on_a_new_sqlite_file_all_start(tmp_path: Path) -> None:
    """Six stores at once on a fresh file, forty times: SQLite's "database is locked"
    while one of them switches the file to WAL is waited out, never a failed start (it
    failed about one round in twenty before)."""
    for round_ in range(40):
        path = tmp_path / str(round_) / "responses.sqlite3"
        stores = [SqliteStore(path, HistoryLimits(), clock=Clock()) for _ in range(6)]
        try:
            await asyncio.gather(*(s.start() for s in stores))
            await stores[0].put(turn("r1"))
            assert await stores[5].get(NO_TENANT, "r1") is not None
        finally:
            for store in stores:
                await store.close()


async def schema_versions(store: ResponseStore) -> list[int]:
    if isinstance(store, SqliteStore):
        with sqlite3.connect(store.path) as conn:
            return [row[0] for row in conn.execute(f"SELECT version FROM {VERSION_TABLE}")]
    assert isinstance(store, PostgresStore)
    return [r[0] for r in await store._pool.fetch(f"SELECT version FROM {VERSION_TABLE}")]


@SQL_ONLY
async def test_a_schema_newer_than_this_gateway_is_refused(
    backend: str, make_store: MakeStore
) -> None:
    first = await make_store()
    if isinstance(first, SqliteStore):
        with sqlite3.connect(first.path) as conn:
            conn.execute(f"UPDATE {VERSION_TABLE} SET version = {LATEST + 1}")
    else:
        assert isinstance(first, PostgresStore)
        await first._pool.execute(f"UPDATE {VERSION_TABLE} SET version = {LATEST + 1}")
    await first.close()
    with pytest.raises(HistoryError, match="newer than this gateway"):
        await make_store()


@SQL_ONLY
async def test_calls_before_start_or_after_close_are_history_errors(
    backend: str, make_store: MakeStore
) -> None:
    store = await make_store(start=False)
    with pytest.raises(HistoryError, match="not started"):
        await store.get(NO_TENANT, "r1")
    await store.start()
    await store.close()
    with pytest.raises(HistoryError, match="not started"):
        await store.put(turn("r1"))


async def test_an_unopenable_sqlite_file_fails_start_clearly(tmp_path: Path) -> None:
    (tmp_path / "is_a_dir").mkdir()
    store = SqliteStore(tmp_path / "is_a_dir")
    with pytest.raises(HistoryError, match="is_a_dir"):
        await store.start()
    await store.close()
    (tmp_path / "not_a_db").write_bytes(b"this is not an SQLite database, at all" * 100)
    store = SqliteStore(tmp_path / "not_a_db")
    with pytest.raises(HistoryError, match="not_a_db"):
        await store.start()


async def test_a_refused_postgres_connection_never_shows_the_password() -> None:
    import socket

    with socket.socket() as probe:  # a loopback port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"postgresql://tandem:s3cret-pw@127.0.0.1:{port}/db?password=qu3ry-pw"
    store = PostgresStore(url, connect_timeout_s=5)
    with pytest.raises(HistoryError) as caught:
        await store.start()
    message = str(caught.value)
    assert "s3cret-pw" not in message and "qu3ry-pw" not in message, message
    assert f"127.0.0.1:{port}" in message and "cannot connect" in message
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    assert "s3cret-pw" not in repr(store)


async def test_a_postgres_server_gone_mid_run_is_a_history_error(
    postgres_server: Any,
) -> None:
    """The database is dropped under a running store (as a server going away would be):
    calls fail with HistoryError, not a driver exception."""
    import asyncpg

    url = postgres_server.new_database()
    store = PostgresStore(url)
    await store.start()
    try:
        admin = await asyncpg.connect(postgres_server.url())
        try:
            name = url.rsplit("/", 1)[1]
            await admin.execute(f"DROP DATABASE {name} WITH (FORCE)")
        finally:
            await admin.close()
        with pytest.raises(HistoryError, match="postgres"):
            await store.put(turn("r1"))
    finally:
        await store.close()
