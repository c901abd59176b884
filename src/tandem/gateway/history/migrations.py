"""The stored-responses schema: an ordered list of steps, applied at start in one transaction.

A database records the last step applied in ``tandem_schema_version``. Each gateway applies
the missing steps when it starts, all in one transaction, so a failed step leaves the schema
as it was; on PostgreSQL under a transaction-scoped advisory lock, so that gateways starting
at once apply each step once (docs/operations.md, "Stored responses (history backends)").
A database migrated by a newer gateway (a version this one does not know) is refused.

A new step is appended, never edited: databases in the field already ran the old ones.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tandem.gateway.history.store import HistoryError

if TYPE_CHECKING:
    import asyncpg

TABLE = "tandem_responses"
CONVERSATIONS = "tandem_conversations"
ITEMS = "tandem_conversation_items"
VERSION_TABLE = "tandem_schema_version"
# pg_advisory_xact_lock key of the migration (any constant; b"tandem" as a number).
PG_MIGRATION_LOCK = 0x74616E64656D


@dataclass(frozen=True, slots=True)
class Step:
    version: int
    what: str
    sqlite: tuple[str, ...]
    postgres: tuple[str, ...]


# Documents are JSON text, not jsonb: a response reads back byte for byte as it was
# answered, the stored size is the counted size, and jsonb's refusal of "\u0000" never
# turns a valid response into a storage error.
STEPS: tuple[Step, ...] = (
    Step(
        version=1,
        what="the responses table",
        sqlite=(
            f"""CREATE TABLE {TABLE} (
                tenant TEXT NOT NULL,
                id TEXT NOT NULL,
                previous_id TEXT,
                created_at REAL NOT NULL,
                status TEXT NOT NULL,
                model TEXT NOT NULL,
                response TEXT NOT NULL,
                input_items TEXT NOT NULL,
                size_bytes INTEGER NOT NULL,
                PRIMARY KEY (tenant, id)
            )""",
            f"CREATE INDEX {TABLE}_created_at ON {TABLE} (created_at)",
        ),
        postgres=(
            f"""CREATE TABLE {TABLE} (
                tenant TEXT NOT NULL,
                id TEXT NOT NULL,
                previous_id TEXT,
                created_at DOUBLE PRECISION NOT NULL,
                status TEXT NOT NULL,
                model TEXT NOT NULL,
                response TEXT NOT NULL,
                input_items TEXT NOT NULL,
                size_bytes BIGINT NOT NULL,
                PRIMARY KEY (tenant, id)
            )""",
            f"CREATE INDEX {TABLE}_created_at ON {TABLE} (created_at)",
        ),
    ),
    Step(
        version=2,
        what="conversations and their items (the Conversations API)",
        sqlite=(
            f"""CREATE TABLE {CONVERSATIONS} (
                tenant TEXT NOT NULL,
                id TEXT NOT NULL,
                created_at REAL NOT NULL,
                updated_at REAL NOT NULL,
                metadata TEXT NOT NULL,
                size_bytes INTEGER NOT NULL,
                PRIMARY KEY (tenant, id)
            )""",
            f"CREATE INDEX {CONVERSATIONS}_updated_at ON {CONVERSATIONS} (updated_at)",
            f"""CREATE TABLE {ITEMS} (
                tenant TEXT NOT NULL,
                conversation_id TEXT NOT NULL,
                seq INTEGER NOT NULL,
                id TEXT NOT NULL,
                item TEXT NOT NULL,
                size_bytes INTEGER NOT NULL,
                PRIMARY KEY (tenant, conversation_id, id)
            )""",
            f"CREATE INDEX {ITEMS}_order ON {ITEMS} (tenant, conversation_id, seq)",
        ),
        postgres=(
            f"""CREATE TABLE {CONVERSATIONS} (
                tenant TEXT NOT NULL,
                id TEXT NOT NULL,
                created_at DOUBLE PRECISION NOT NULL,
                updated_at DOUBLE PRECISION NOT NULL,
                metadata TEXT NOT NULL,
                size_bytes BIGINT NOT NULL,
                PRIMARY KEY (tenant, id)
            )""",
            f"CREATE INDEX {CONVERSATIONS}_updated_at ON {CONVERSATIONS} (updated_at)",
            f"""CREATE TABLE {ITEMS} (
                tenant TEXT NOT NULL,
                conversation_id TEXT NOT NULL,
                seq BIGINT NOT NULL,
                id TEXT NOT NULL,
                item TEXT NOT NULL,
                size_bytes BIGINT NOT NULL,
                PRIMARY KEY (tenant, conversation_id, id)
            )""",
            f"CREATE INDEX {ITEMS}_order ON {ITEMS} (tenant, conversation_id, seq)",
        ),
    ),
)
LATEST = STEPS[-1].version

_CREATE_VERSION = f"CREATE TABLE IF NOT EXISTS {VERSION_TABLE} (version INTEGER NOT NULL)"


def _pending(current: int | None, where: str) -> list[Step]:
    if current is not None and current > LATEST:
        raise HistoryError(
            f"{where}: the stored-responses schema is at version {current}, newer than this "
            f"gateway knows ({LATEST}); run the newer gateway or another database"
        )
    return [step for step in STEPS if step.version > (current or 0)]


def migrate_sqlite(conn: sqlite3.Connection, where: str) -> int:
    """Bring an SQLite database (autocommit connection) to :data:`LATEST`; returns the
    number of steps applied. ``BEGIN IMMEDIATE`` takes the write lock first, so a second
    process starting at once waits (busy timeout), then finds the steps done."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(_CREATE_VERSION)
        row = conn.execute(f"SELECT MAX(version) FROM {VERSION_TABLE}").fetchone()
        current = row[0] if row else None
        steps = _pending(current, where)
        for step in steps:
            for statement in step.sqlite:
                conn.execute(statement)
        if steps:
            conn.execute(f"DELETE FROM {VERSION_TABLE}")
            conn.execute(f"INSERT INTO {VERSION_TABLE} (version) VALUES (?)", (LATEST,))
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:  # SQLite may have rolled back on its own already
            conn.execute("ROLLBACK")
        raise
    return len(steps)


async def migrate_postgres(conn: asyncpg.Connection, where: str) -> int:
    """Bring a PostgreSQL database to :data:`LATEST`; returns the number of steps applied."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", PG_MIGRATION_LOCK)
        await conn.execute(_CREATE_VERSION)
        current = await conn.fetchval(f"SELECT MAX(version) FROM {VERSION_TABLE}")
        steps = _pending(current, where)
        for step in steps:
            for statement in step.postgres:
                await conn.execute(statement)
        if steps:
            await conn.execute(f"DELETE FROM {VERSION_TABLE}")
            await conn.execute(f"INSERT INTO {VERSION_TABLE} (version) VALUES ($1)", LATEST)
    return len(steps)
