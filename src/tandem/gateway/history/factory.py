"""``--history-backend`` → the store the gateway keeps its Responses API conversations in."""

from __future__ import annotations

from tandem.gateway.config import GatewayConfig
from tandem.gateway.history.settings import default_sqlite_path, with_tenant_share
from tandem.gateway.history.store import ResponseStore


def tenant_count(config: GatewayConfig) -> int:
    """The tenants whose requests may store responses: each one a --tenant-api-key names,
    and the keyless tenant when --api-key is set or no key at all (a gateway with tenant
    keys only refuses keyless requests, so that tenant stores nothing)."""
    named = {key.tenant for key in config.tenant_api_keys}
    keyless = config.api_key is not None or not named
    return len(named) + int(keyless)


def open_store(config: GatewayConfig) -> ResponseStore | None:
    """The configured store, not yet started (no I/O here: ``start()`` connects); None for
    ``none``. Backends are imported on demand: asyncpg only loads for ``postgres``."""
    backend = config.history_backend
    if backend == "none":
        return None
    limits = with_tenant_share(config.history, tenant_count(config))
    if backend == "memory":
        from tandem.gateway.history.memory import MemoryStore

        return MemoryStore(limits)
    if backend == "sqlite":
        from tandem.gateway.history.sqlite import SqliteStore

        return SqliteStore(config.history_sqlite_path or default_sqlite_path(), limits)
    if backend == "postgres":
        from tandem.gateway.history.postgres import PostgresStore

        assert config.postgres_db_url is not None  # GatewayConfig checks it
        return PostgresStore(config.postgres_db_url, limits)
    raise ValueError(f"unknown history backend {backend!r}")
