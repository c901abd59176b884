"""``--history-backend postgres``: one database shared by several gateways (asyncpg pool).

Each gateway keeps a small pool; every statement below is one implicit transaction, and a
commit returns only once PostgreSQL has it on disk (``synchronous_commit = on`` is set for
our sessions whatever the server's default). Migrations run under an advisory lock, so
gateways starting at once are safe; retention sweeps take a try-lock, so only one of them
sweeps at a time (docs/operations.md, "Stored responses (history backends)").

Errors become :class:`HistoryError` with the URL redacted and the password masked, and
without the driver's exception chained (its text or arguments might show the URL).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import asyncpg

from tandem.ascii_int import ascii_int
from tandem.gateway.history.codec import encoded
from tandem.gateway.history.migrations import (
    CONVERSATIONS,
    PG_MIGRATION_LOCK,
    TABLE,
    migrate_postgres,
)
from tandem.gateway.history.pgconv import SQL as CONVERSATION_SQL
from tandem.gateway.history.pgconv import PostgresConversations
from tandem.gateway.history.pgurl import redacted, scrubbed
from tandem.gateway.history.retention import Sweeper, check_size, expiry_cutoff, tenant_cap
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

_DRIVER_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,  # connection closed, configuration errors
    asyncpg.InternalClientError,
    OSError,  # refused, unreachable, reset
    TimeoutError,
    ValueError,  # a URL asyncpg cannot parse
)
# The retention sweep's try-lock (another gateway sweeping: this one skips its turn).
_SWEEP_LOCK = PG_MIGRATION_LOCK + 1

_PUT = f"""
    INSERT INTO {TABLE} ({COLUMNS}, size_bytes) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
    ON CONFLICT (tenant, id) DO UPDATE SET
        previous_id = excluded.previous_id, created_at = excluded.created_at,
        status = excluded.status, model = excluded.model, response = excluded.response,
        input_items = excluded.input_items, size_bytes = excluded.size_bytes
"""
_GET = f"SELECT {COLUMNS} FROM {TABLE} WHERE tenant = $1 AND id = $2 AND created_at >= $3"
_CHAIN = chain_sql(TABLE, ("$1", "$2", "$3::double precision", "$4::integer"))
_DELETE = f"DELETE FROM {TABLE} WHERE tenant = $1 AND id = $2 AND created_at >= $3"
_EXPIRE = f"DELETE FROM {TABLE} WHERE created_at < $1"
_EVICT = evict_sql((TABLE, CONVERSATIONS), "$1::bigint")
_EVICT_TENANT = evict_sql((TABLE, CONVERSATIONS), "$1::bigint", per_tenant=True)


def _count(status: str) -> int:
    """Rows affected, from a command tag such as ``DELETE 3``."""
    return ascii_int(status.rsplit(" ", 1)[-1]) or 0


class PostgresStore(PostgresConversations):
    def __init__(
        self,
        url: str,
        limits: HistoryLimits | None = None,
        clock: Callable[[], float] = time.time,
        pool_size: int = 4,
        connect_timeout_s: float = 10.0,
        command_timeout_s: float = 30.0,
    ) -> None:
        self._url = url
        self.where = redacted(url)
        self.limits = limits or HistoryLimits()
        self._clock = clock
        self._pool_size = pool_size
        self._connect_timeout_s = connect_timeout_s
        self._command_timeout_s = command_timeout_s
        self._pool: Any = None  # asyncpg.Pool
        self._sweeper = Sweeper(self.sweep, self.limits.sweep_interval_s, self.name)

    def __repr__(self) -> str:
        return f"postgres {self.where}"  # never the URL itself: it may hold a password

    @property
    def name(self) -> str:
        return "postgres"

    @contextlib.contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except HistoryError:
            raise
        except _DRIVER_ERRORS as exc:
            detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            raise HistoryError(
                scrubbed(f"postgres {self.where}: {what}: {detail}", self._url)
            ) from None

    async def _with_pool(self, what: str, fn: Callable[[Any], Awaitable[T]]) -> T:
        pool = self._pool
        if pool is None:
            raise HistoryError(f"postgres {self.where}: the store is not started")
        with self._errors(what):
            return await fn(pool)

    async def start(self) -> None:
        if self._pool is not None:
            return
        with self._errors("cannot connect"):
            pool = await asyncpg.create_pool(
                self._url,
                # No floor to keep: while the database is away, asyncpg would retry one in
                # the background and log each failure with a traceback; connections open
                # on demand instead, and a request that needs one gets a coded 503.
                min_size=0,
                max_size=self._pool_size,
                timeout=self._connect_timeout_s,
                command_timeout=self._command_timeout_s,
                server_settings={"application_name": "tandem-gateway", "synchronous_commit": "on"},
            )
            # With no floor the pool connects lazily: a database that is down must still
            # fail the start here, in these words.
            try:
                async with pool.acquire():
                    pass
            except BaseException:
                pool.terminate()
                raise
        self._pool = pool
        try:
            applied = await self._with_pool("migrate", self._migrate)
            if applied:
                log.info(
                    "history postgres %s: schema created or migrated (%d steps)",
                    self.where,
                    applied,
                )
            await self._sweeper.start()
        except BaseException:
            await self.close()
            raise

    async def _migrate(self, pool: Any) -> int:
        async with pool.acquire() as conn:
            return await migrate_postgres(conn, f"postgres {self.where}")

    async def close(self) -> None:
        await self._sweeper.stop()
        pool, self._pool = self._pool, None
        if pool is None:
            return
        try:
            await asyncio.wait_for(pool.close(), timeout=5.0)
        except _DRIVER_ERRORS:
            pool.terminate()  # a hung server must not hold up the gateway's exit

    async def put(self, item: StoredResponse) -> None:
        response, input_items = encoded(item.response), encoded(item.input_items)
        size = len(response) + len(input_items)
        check_size(size, self.limits)
        args = (
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
        await self._with_pool("put", lambda pool: pool.execute(_PUT, *args))

    def _cutoff(self) -> float:
        return expiry_cutoff(self.limits, self._clock())

    async def get(self, tenant: str, response_id: str) -> StoredResponse | None:
        cutoff = self._cutoff()
        row = await self._with_pool(
            "get", lambda pool: pool.fetchrow(_GET, tenant, response_id, cutoff)
        )
        return stored_from_row(tuple(row)) if row is not None else None

    async def chain(self, tenant: str, response_id: str) -> list[StoredResponse] | None:
        args = (tenant, response_id, self._cutoff(), self.limits.max_turns)
        rows = await self._with_pool("chain", lambda pool: pool.fetch(_CHAIN, *args))
        return finish_chain([tuple(r) for r in rows], self.limits.max_turns) if rows else None

    async def delete(self, tenant: str, response_id: str) -> bool:
        args = (tenant, response_id, self._cutoff())
        status = await self._with_pool("delete", lambda pool: pool.execute(_DELETE, *args))
        return _count(status) > 0

    async def sweep(self) -> int:
        cutoff, cap = self._cutoff(), self.limits.max_total_bytes
        per_tenant = tenant_cap(self.limits)

        async def apply(pool: Any) -> int:
            async with pool.acquire() as conn, conn.transaction():
                if not await conn.fetchval("SELECT pg_try_advisory_xact_lock($1)", _SWEEP_LOCK):
                    return 0  # another gateway is sweeping the same rows right now
                deleted = _count(await conn.execute(_EXPIRE, cutoff))
                deleted += _count(await conn.execute(CONVERSATION_SQL.expire, cutoff))
                # Tenants over their own cap first (as on SQLite): the total may then fit.
                for statements, bound in ((_EVICT_TENANT, per_tenant), (_EVICT, cap)):
                    for statement in statements if bound else ():
                        deleted += _count(await conn.execute(statement, bound))
                await conn.execute(CONVERSATION_SQL.orphans)  # the items of conversations gone
                return deleted

        return await self._with_pool("retention sweep", apply)
