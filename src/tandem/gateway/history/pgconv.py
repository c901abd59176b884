"""The PostgreSQL store's conversations (contract in store.py, statements in sqlconv.py).

Every change is one transaction that first locks the conversation's row (``FOR UPDATE``),
so two gateways appending to one conversation take turns: sequence numbers never repeat
and the row's size is always its items' sum.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from tandem.gateway.history.codec import decoded, encoded
from tandem.gateway.history.retention import check_conversation_size
from tandem.gateway.history.sqlconv import conversation_from_row, encoded_items, spelled
from tandem.gateway.history.store import HistoryLimits, StoredConversation

T = TypeVar("T")
SQL = spelled("$", lock_suffix=" FOR UPDATE")


async def _insert_items(
    conn: Any, tenant: str, conversation_id: str, rows: list[tuple[str, str, int]]
) -> None:
    seq = await conn.fetchval(SQL.next_seq, tenant, conversation_id)
    await conn.executemany(
        SQL.insert_item,
        [(tenant, conversation_id, seq + i, *row) for i, row in enumerate(rows)],
    )


def _count(status: str) -> int:
    return int(status.rsplit(" ", 1)[-1] or 0)


class PostgresConversations:
    """Mixed into PostgresStore, which provides the methods declared here."""

    limits: HistoryLimits

    async def _with_pool(self, what: str, fn: Callable[[Any], Awaitable[T]]) -> T:
        raise NotImplementedError  # PostgresStore's own

    def _cutoff(self) -> float:
        raise NotImplementedError  # PostgresStore's own

    async def _in_transaction(self, what: str, fn: Callable[[Any], Awaitable[T]]) -> T:
        async def run(pool: Any) -> T:
            async with pool.acquire() as conn, conn.transaction():
                return await fn(conn)

        return await self._with_pool(what, run)

    async def create_conversation(
        self, conversation: StoredConversation, items: list[dict[str, Any]]
    ) -> None:
        c = conversation
        rows = encoded_items(items, set())
        metadata = encoded(c.metadata)
        size = len(metadata) + sum(row[2] for row in rows)
        check_conversation_size(size, self.limits)
        values = (c.tenant, c.id, c.created_at, c.updated_at, metadata.decode("utf-8"), size)

        async def write(conn: Any) -> None:
            await conn.execute(SQL.insert, *values)
            await _insert_items(conn, c.tenant, c.id, rows)

        await self._in_transaction("create conversation", write)

    async def get_conversation(
        self, tenant: str, conversation_id: str
    ) -> StoredConversation | None:
        args = (tenant, conversation_id, self._cutoff())
        row = await self._with_pool("get conversation", lambda pool: pool.fetchrow(SQL.get, *args))
        return conversation_from_row(tuple(row)) if row is not None else None

    async def update_conversation(
        self, tenant: str, conversation_id: str, metadata: dict[str, str], now: float
    ) -> StoredConversation | None:
        args = (tenant, conversation_id, self._cutoff())
        new = encoded(metadata)

        async def write(conn: Any) -> Any:
            locked = await conn.fetchrow(SQL.lock, *args)
            if locked is None:
                return None
            size = locked[0] - len(str(locked[1]).encode("utf-8")) + len(new)
            check_conversation_size(size, self.limits)
            await conn.execute(
                SQL.set_metadata, tenant, conversation_id, new.decode("utf-8"), size, now
            )
            return await conn.fetchrow(SQL.get, *args)

        row = await self._in_transaction("update conversation", write)
        return conversation_from_row(tuple(row)) if row is not None else None

    async def delete_conversation(self, tenant: str, conversation_id: str) -> bool:
        args = (tenant, conversation_id, self._cutoff())

        async def remove(conn: Any) -> bool:
            if _count(await conn.execute(SQL.delete, *args)) == 0:
                return False
            await conn.execute(SQL.delete_items_of, tenant, conversation_id)
            return True

        return await self._in_transaction("delete conversation", remove)

    async def add_items(
        self, tenant: str, conversation_id: str, items: list[dict[str, Any]], now: float
    ) -> bool:
        args = (tenant, conversation_id, self._cutoff())

        async def write(conn: Any) -> bool:
            locked = await conn.fetchrow(SQL.lock, *args)
            if locked is None:
                return False
            taken = {r[0] for r in await conn.fetch(SQL.item_ids, tenant, conversation_id)}
            rows = encoded_items(items, taken)
            size = locked[0] + sum(row[2] for row in rows)
            check_conversation_size(size, self.limits)
            await _insert_items(conn, tenant, conversation_id, rows)
            await conn.execute(SQL.touch, tenant, conversation_id, size, now)
            return True

        return await self._in_transaction("add conversation items", write)

    async def conversation_items(
        self, tenant: str, conversation_id: str
    ) -> list[dict[str, Any]] | None:
        args = (tenant, conversation_id, self._cutoff())

        async def read(conn: Any) -> list[Any] | None:
            if await conn.fetchrow(SQL.get, *args) is None:
                return None
            return list(await conn.fetch(SQL.items, tenant, conversation_id))

        rows = await self._in_transaction("list conversation items", read)
        return [decoded(row[0]) for row in rows] if rows is not None else None

    async def get_item(
        self, tenant: str, conversation_id: str, item_id: str
    ) -> dict[str, Any] | None:
        args = (tenant, conversation_id, item_id, self._cutoff())
        row = await self._with_pool(
            "get conversation item", lambda pool: pool.fetchrow(SQL.get_item, *args)
        )
        return decoded(row[0]) if row is not None else None

    async def delete_item(
        self, tenant: str, conversation_id: str, item_id: str, now: float
    ) -> bool:
        args = (tenant, conversation_id, self._cutoff())

        async def remove(conn: Any) -> bool:
            locked = await conn.fetchrow(SQL.lock, *args)
            if locked is None:
                return False
            size = await conn.fetchval(SQL.item_size, tenant, conversation_id, item_id)
            if size is None:
                return False
            await conn.execute(SQL.delete_item, tenant, conversation_id, item_id)
            await conn.execute(SQL.touch, tenant, conversation_id, locked[0] - size, now)
            return True

        return await self._in_transaction("delete conversation item", remove)
