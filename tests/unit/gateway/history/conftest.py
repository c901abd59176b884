"""Stores on every backend for the history tests: memory, SQLite (a file in tmp_path) and
PostgreSQL (a real server of the session's own, tests/integration/postgres_server.py; each
test gets a fresh database)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from history_fakes import BACKENDS, Clock, MakeStore

from tandem.gateway.history.memory import MemoryStore
from tandem.gateway.history.postgres import PostgresStore
from tandem.gateway.history.sqlite import SqliteStore
from tandem.gateway.history.store import HistoryLimits, ResponseStore


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def location(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    """Where the backend keeps its rows: one file or one database per test."""
    if backend == "sqlite":
        return tmp_path / "history" / "responses.sqlite3"
    if backend == "postgres":
        return request.getfixturevalue("postgres_server").new_database()
    return None


@pytest.fixture
async def make_store(backend: str, location: Any) -> AsyncIterator[MakeStore]:
    """Builds started stores on this test's file or database; all closed at the end."""
    opened: list[ResponseStore] = []

    async def make(
        limits: HistoryLimits | None = None, clock: Clock | None = None, start: bool = True
    ) -> ResponseStore:
        limits = limits or HistoryLimits()
        clock = clock or Clock()
        store: ResponseStore
        if backend == "memory":
            store = MemoryStore(limits, clock=clock)
        elif backend == "sqlite":
            store = SqliteStore(location, limits, clock=clock)
        else:
            store = PostgresStore(location, limits, clock=clock)
        opened.append(store)
        if start:
            await store.start()
        return store

    yield make
    for store in opened:
        await store.close()
