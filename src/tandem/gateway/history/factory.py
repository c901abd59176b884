"""``--history-backend`` → the store the gateway keeps its Responses API conversations in."""

from __future__ import annotations

from tandem.gateway.config import GatewayConfig
from tandem.gateway.history.settings import default_sqlite_path
from tandem.gateway.history.store import ResponseStore


def open_store(config: GatewayConfig) -> ResponseStore | None:
    """The configured store, not yet started (no I/O here: ``start()`` connects); None for
    ``none``. Backends are imported on demand: asyncpg only loads for ``postgres``."""
    backend = config.history_backend
    if backend == "none":
        return None
    if backend == "memory":
        from tandem.gateway.history.memory import MemoryStore

        return MemoryStore(config.history)
    if backend == "sqlite":
        from tandem.gateway.history.sqlite import SqliteStore

        return SqliteStore(config.history_sqlite_path or default_sqlite_path(), config.history)
    if backend == "postgres":
        from tandem.gateway.history.postgres import PostgresStore

        assert config.postgres_db_url is not None  # GatewayConfig checks it
        return PostgresStore(config.postgres_db_url, config.history)
    raise ValueError(f"unknown history backend {backend!r}")
