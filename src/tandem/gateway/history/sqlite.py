"""``--history-backend sqlite`` (the default): one file, durable, shared by local processes.

The connection lives on one dedicated thread (a single-worker executor): sqlite3 blocks, so
no call runs on the event loop, and one thread means one connection whose statements never
interleave. WAL journal with ``synchronous=FULL``: a commit is on disk before ``put``
returns, readers do not block the writer, and two gateways on one file take turns through
the busy timeout (docs/operations.md, "Stored responses (history backends)").
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from tandem.gateway.history.codec import encoded
from tandem.gateway.history.migrations import CONVERSATIONS, TABLE, migrate_sqlite
from tandem.gateway.history.retention import Sweeper, check_size, expiry_cutoff, tenant_cap
from tandem.gateway.history.sqliteconv import SQL as CONVERSATION_SQL
from tandem.gateway.history.sqliteconv import SqliteConversations
from tandem.gateway.history.sqlrows import (
    COLUMNS,
    chain_sql,
    evict_sql,
    finish_chain,
    stored_from_row,
)
from tandem.gateway.history.store import HistoryError, HistoryLimits, StoredResponse

log = logging.getLogger("tandem.gateway.history")
T = TypeVar("T")

_PUT = f"""
    INSERT INTO {TABLE} ({COLUMNS}, size_bytes) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT (tenant, id) DO UPDATE SET
        previous_id = excluded.previous_id, created_at = excluded.created_at,
        status = excluded.status, model = excluded.model, response = excluded.response,
        input_items = excluded.input_items, size_bytes = excluded.size_bytes
"""
_GET = f"SELECT {COLUMNS} FROM {TABLE} WHERE tenant = ? AND id = ? AND created_at >= ?"
_CHAIN = chain_sql(TABLE, ("?1", "?2", "?3", "?4"))
_DELETE = f"DELETE FROM {TABLE} WHERE tenant = ? AND id = ? AND created_at >= ?"
_EXPIRE = f"DELETE FROM {TABLE} WHERE created_at < ?"
_EVICT = evict_sql((TABLE, CONVERSATIONS), "?")
_EVICT_TENANT = evict_sql((TABLE, CONVERSATIONS), "?", per_tenant=True)


class SqliteStore(SqliteConversations):
    def __init__(
        self,
        path: Path,
        limits: HistoryLimits | None = None,
        clock: Callable[[], float] = time.time,
        busy_timeout_s: float = 10.0,
    ) -> None:
        self.path = Path(path)
        self.limits = limits or HistoryLimits()
        self._clock = clock
        self._busy_timeout_s = busy_timeout_s
        self._executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None  # touched on the executor's thread only
        self._sweeper = Sweeper(self.sweep, self.limits.sweep_interval_s, self.name)

    @property
    def name(self) -> str:
        return "sqlite"

    def __repr__(self) -> str:
        return f"sqlite {self.path}"

    async def _run(self, what: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        executor = self._executor
        if executor is None:
            raise HistoryError(f"sqlite {self.path}: the store is not started")

        def call() -> T:
            assert self._conn is not None
            return fn(self._conn)

        try:
            return await asyncio.get_running_loop().run_in_executor(executor, call)
        except sqlite3.Error as exc:  # locked past the busy timeout, disk I/O, corrupt file
            raise HistoryError(f"sqlite {self.path}: {what}: {exc}") from None

    async def start(self) -> None:
        if self._executor is not None:
            return
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="tandem-history")
        try:
            await self._run_open()
            await self._sweeper.start()
        except BaseException:
            await self.close()
            raise

    async def _run_open(self) -> None:
        assert self._executor is not None
        loop = asyncio.get_running_loop()
        try:
            applied = await loop.run_in_executor(self._executor, self._open)
        except (sqlite3.Error, OSError) as exc:
            raise HistoryError(f"sqlite {self.path}: cannot open: {exc}") from None
        if applied:
            log.info("history sqlite %s: schema created or migrated (%d steps)", self.path, applied)

    def _open(self) -> int:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not self.path.exists():
            # Stored conversations are private: the file (and so its -wal and -shm files,
            # which SQLite creates with the database's mode) is for this user only.
            os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
        conn = sqlite3.connect(
            self.path, timeout=self._busy_timeout_s, isolation_level=None, check_same_thread=True
        )
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_s * 1000)}")
            mode = _locked_retry(
                lambda: conn.execute("PRAGMA journal_mode = WAL").fetchone()[0],
                self._busy_timeout_s,
            )
            if str(mode).lower() != "wal":
                log.warning("history sqlite %s: journal mode %s, not wal", self.path, mode)
            conn.execute("PRAGMA synchronous = FULL")
            applied = _locked_retry(
                lambda: migrate_sqlite(conn, f"sqlite {self.path}"), self._busy_timeout_s
            )
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return applied

    async def close(self) -> None:
        await self._sweeper.stop()
        executor, self._executor = self._executor, None
        if executor is None:
            return

        def shut() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        try:
            await asyncio.get_running_loop().run_in_executor(executor, shut)
        finally:
            executor.shutdown(wait=True)

    async def put(self, item: StoredResponse) -> None:
        response, input_items = encoded(item.response), encoded(item.input_items)
        size = len(response) + len(input_items)
        check_size(size, self.limits)
        values = (
            item.tenant,
            item.id,
            item.previous_id,
            item.created_at,
            item.status,
            item.model,
            response.decode("utf-8"),
            input_items.decode("utf-8"),
            size,
        )

        def write(conn: sqlite3.Connection) -> None:
            conn.execute(_PUT, values)  # autocommit: one statement, one durable transaction

        await self._run("put", write)

    def _cutoff(self) -> float:
        return expiry_cutoff(self.limits, self._clock())

    async def get(self, tenant: str, response_id: str) -> StoredResponse | None:
        cutoff = self._cutoff()

        def read(conn: sqlite3.Connection) -> Any:
            return conn.execute(_GET, (tenant, response_id, cutoff)).fetchone()

        row = await self._run("get", read)
        return stored_from_row(row) if row is not None else None

    async def chain(self, tenant: str, response_id: str) -> list[StoredResponse] | None:
        params = (tenant, response_id, self._cutoff(), self.limits.max_turns)

        def walk(conn: sqlite3.Connection) -> list[Any]:
            return conn.execute(_CHAIN, params).fetchall()

        rows = await self._run("chain", walk)
        return finish_chain(rows, self.limits.max_turns) if rows else None

    async def delete(self, tenant: str, response_id: str) -> bool:
        params = (tenant, response_id, self._cutoff())

        def remove(conn: sqlite3.Connection) -> int:
            return conn.execute(_DELETE, params).rowcount

        return await self._run("delete", remove) > 0

    async def sweep(self) -> int:
        cutoff, cap = self._cutoff(), self.limits.max_total_bytes
        per_tenant = tenant_cap(self.limits)

        def apply(conn: sqlite3.Connection) -> int:
            conn.execute("BEGIN IMMEDIATE")
            try:
                deleted = conn.execute(_EXPIRE, (cutoff,)).rowcount
                deleted += conn.execute(CONVERSATION_SQL.expire, (cutoff,)).rowcount
                # Tenants over their own cap first: what they give up may bring the total
                # under its cap, so that nobody else's rows need to go.
                for statements, bound in ((_EVICT_TENANT, per_tenant), (_EVICT, cap)):
                    for statement in statements if bound else ():
                        deleted += conn.execute(statement, (bound,)).rowcount
                conn.execute(CONVERSATION_SQL.orphans)  # the items of conversations gone
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            return deleted

        return await self._run("retention sweep", apply)


def _locked_retry(step: Callable[[], T], timeout_s: float) -> T:
    """``step``, again while SQLite says the database is locked, for up to ``timeout_s``.

    Gateways starting at once on a new file race to switch it to WAL and to create the
    schema; in that window SQLite can answer "database is locked" without waiting for the
    busy timeout (seen in about 1 of 20 starts of 6 stores). The step is idempotent.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return step()
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(0.01)
