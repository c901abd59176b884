"""The SQLite store's conversations (contract in store.py, statements in sqlconv.py).

Every change is one ``BEGIN IMMEDIATE`` transaction on the store's one connection: the
conversation's row is read, the items written and the row's size and age updated together,
so a reader never sees items counted without their bytes, nor a half-added batch.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any, TypeVar

from tandem.gateway.history.codec import decoded, encoded
from tandem.gateway.history.retention import check_conversation_size
from tandem.gateway.history.sqlconv import conversation_from_row, encoded_items, spelled
from tandem.gateway.history.store import HistoryLimits, StoredConversation

T = TypeVar("T")
SQL = spelled("?")


def _in_transaction(conn: sqlite3.Connection, fn: Callable[[], T]) -> T:
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = fn()
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return result


def _insert_items(
    conn: sqlite3.Connection, tenant: str, conversation_id: str, rows: list[tuple[str, str, int]]
) -> None:
    seq = conn.execute(SQL.next_seq, (tenant, conversation_id)).fetchone()[0]
    conn.executemany(
        SQL.insert_item,
        [(tenant, conversation_id, seq + i, *row) for i, row in enumerate(rows)],
    )


class SqliteConversations:
    """Mixed into SqliteStore, which provides the methods declared here."""

    limits: HistoryLimits

    async def _run(self, what: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        raise NotImplementedError  # SqliteStore's own

    def _cutoff(self) -> float:
        raise NotImplementedError  # SqliteStore's own

    async def create_conversation(
        self, conversation: StoredConversation, items: list[dict[str, Any]]
    ) -> None:
        c = conversation
        rows = encoded_items(items, set())
        metadata = encoded(c.metadata)
        size = len(metadata) + sum(row[2] for row in rows)
        check_conversation_size(size, self.limits)
        values = (c.tenant, c.id, c.created_at, c.updated_at, metadata.decode("utf-8"), size)

        def write(conn: sqlite3.Connection) -> None:
            def steps() -> None:
                conn.execute(SQL.insert, values)
                _insert_items(conn, c.tenant, c.id, rows)

            _in_transaction(conn, steps)

        await self._run("create conversation", write)

    async def get_conversation(
        self, tenant: str, conversation_id: str
    ) -> StoredConversation | None:
        params = (tenant, conversation_id, self._cutoff())

        def read(conn: sqlite3.Connection) -> Any:
            return conn.execute(SQL.get, params).fetchone()

        row = await self._run("get conversation", read)
        return conversation_from_row(row) if row is not None else None

    async def update_conversation(
        self, tenant: str, conversation_id: str, metadata: dict[str, str], now: float
    ) -> StoredConversation | None:
        params = (tenant, conversation_id, self._cutoff())
        new = encoded(metadata)

        def write(conn: sqlite3.Connection) -> Any:
            def steps() -> Any:
                locked = conn.execute(SQL.lock, params).fetchone()
                if locked is None:
                    return None
                size = locked[0] - len(str(locked[1]).encode("utf-8")) + len(new)
                check_conversation_size(size, self.limits)
                conn.execute(
                    SQL.set_metadata, (tenant, conversation_id, new.decode("utf-8"), size, now)
                )
                return conn.execute(SQL.get, params).fetchone()

            return _in_transaction(conn, steps)

        row = await self._run("update conversation", write)
        return conversation_from_row(row) if row is not None else None

    async def delete_conversation(self, tenant: str, conversation_id: str) -> bool:
        params = (tenant, conversation_id, self._cutoff())

        def remove(conn: sqlite3.Connection) -> bool:
            def steps() -> bool:
                if conn.execute(SQL.delete, params).rowcount == 0:
                    return False
                conn.execute(SQL.delete_items_of, params[:2])
                return True

            return _in_transaction(conn, steps)

        return await self._run("delete conversation", remove)

    async def add_items(
        self, tenant: str, conversation_id: str, items: list[dict[str, Any]], now: float
    ) -> bool:
        params = (tenant, conversation_id, self._cutoff())

        def write(conn: sqlite3.Connection) -> bool:
            def steps() -> bool:
                locked = conn.execute(SQL.lock, params).fetchone()
                if locked is None:
                    return False
                taken = {r[0] for r in conn.execute(SQL.item_ids, params[:2]).fetchall()}
                rows = encoded_items(items, taken)
                size = locked[0] + sum(row[2] for row in rows)
                check_conversation_size(size, self.limits)
                _insert_items(conn, tenant, conversation_id, rows)
                conn.execute(SQL.touch, (tenant, conversation_id, size, now))
                return True

            return _in_transaction(conn, steps)

        return await self._run("add conversation items", write)

    async def conversation_items(
        self, tenant: str, conversation_id: str
    ) -> list[dict[str, Any]] | None:
        params = (tenant, conversation_id, self._cutoff())

        def read(conn: sqlite3.Connection) -> list[Any] | None:
            def steps() -> list[Any] | None:
                if conn.execute(SQL.get, params).fetchone() is None:
                    return None
                return conn.execute(SQL.items, params[:2]).fetchall()

            # One transaction: the items read are those of the row just found.
            conn.execute("BEGIN")
            try:
                return steps()
            finally:
                conn.execute("COMMIT")

        rows = await self._run("list conversation items", read)
        return [decoded(row[0]) for row in rows] if rows is not None else None

    async def get_item(
        self, tenant: str, conversation_id: str, item_id: str
    ) -> dict[str, Any] | None:
        params = (tenant, conversation_id, item_id, self._cutoff())

        def read(conn: sqlite3.Connection) -> Any:
            return conn.execute(SQL.get_item, params).fetchone()

        row = await self._run("get conversation item", read)
        return decoded(row[0]) if row is not None else None

    async def delete_item(
        self, tenant: str, conversation_id: str, item_id: str, now: float
    ) -> bool:
        params = (tenant, conversation_id, self._cutoff())

        def remove(conn: sqlite3.Connection) -> bool:
            def steps() -> bool:
                locked = conn.execute(SQL.lock, params).fetchone()
                if locked is None:
                    return False
                found = conn.execute(SQL.item_size, (tenant, conversation_id, item_id))
                size = found.fetchone()
                if size is None:
                    return False
                conn.execute(SQL.delete_item, (tenant, conversation_id, item_id))
                conn.execute(SQL.touch, (tenant, conversation_id, locked[0] - size[0], now))
                return True

            return _in_transaction(conn, steps)

        return await self._run("delete conversation item", remove)
