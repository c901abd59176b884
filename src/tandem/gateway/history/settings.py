"""The history settings' checks and defaults, shared by the config and the factory.

Kept apart from ``factory.py`` so that ``gateway/config.py`` can check its fields without
importing the backends (nor the backends the config).
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from tandem.gateway.history.store import HistoryLimits
from tandem.gateway.types import HISTORY_BACKENDS

HISTORY_DIR_ENV = "TANDEM_HISTORY_DIR"
SQLITE_FILE = "responses.sqlite3"
POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def default_sqlite_path() -> Path:
    """``$TANDEM_HISTORY_DIR/responses.sqlite3``, else under ``~/.cache/tandem/history``.

    Read when the store opens, not when the flags are parsed, so that tests (which set the
    variable) and ``tandem serve``'s gateway (which inherits it) agree on the file.
    """
    env = os.environ.get(HISTORY_DIR_ENV)
    root = Path(env) if env else Path.home() / ".cache" / "tandem" / "history"
    return root / SQLITE_FILE


def check_history_settings(
    backend: str, sqlite_path: Path | None, postgres_db_url: str | None, limits: HistoryLimits
) -> None:
    """Raise ValueError naming the flag; never echo the URL (it may hold a password)."""
    if backend not in HISTORY_BACKENDS:
        raise ValueError(f"--history-backend must be one of {', '.join(HISTORY_BACKENDS)}")
    if backend == "postgres":
        if not postgres_db_url:
            raise ValueError("--history-backend postgres needs --postgres-db-url")
        if not postgres_db_url.startswith(POSTGRES_SCHEMES):
            raise ValueError("--postgres-db-url must start with postgresql:// (or postgres://)")
    elif postgres_db_url is not None:
        raise ValueError("--postgres-db-url needs --history-backend postgres")
    if sqlite_path is not None and backend != "sqlite":
        raise ValueError("--history-sqlite-path needs --history-backend sqlite")
    if limits.ttl_s is not None and not limits.ttl_s > 0:
        raise ValueError("--history-ttl-secs must be >= 0 (0: kept until deleted)")
    if limits.max_total_bytes < 0:
        raise ValueError("--history-max-mb must be >= 0 (0: no total cap)")
    if limits.max_response_bytes < 1:
        raise ValueError("--history-max-response-mb must be positive")
    if limits.max_total_bytes and limits.max_response_bytes > limits.max_total_bytes:
        raise ValueError("--history-max-response-mb must not be over --history-max-mb")
    _check_tenant_cap(limits)
    if limits.max_turns < 1:
        raise ValueError("--history-max-turns must be >= 1")
    if not limits.sweep_interval_s > 0:
        raise ValueError("the history sweep interval must be positive")


def _check_tenant_cap(limits: HistoryLimits) -> None:
    cap = limits.max_tenant_bytes
    if cap is None or cap == 0:  # the default share (always valid), or no per-tenant cap
        return
    if cap < 0:
        raise ValueError("--history-tenant-max-mb must be >= 0 (0: no per-tenant cap)")
    if limits.max_total_bytes and cap > limits.max_total_bytes:
        raise ValueError("--history-tenant-max-mb must not be over --history-max-mb")
    if limits.max_response_bytes > cap:
        # A response the gateway accepts must fit its tenant's cap, or storing it would
        # evict the whole tenant and still fail.
        raise ValueError("--history-max-response-mb must not be over --history-tenant-max-mb")


def with_tenant_share(limits: HistoryLimits, tenants: int) -> HistoryLimits:
    """``limits`` with ``max_tenant_bytes`` resolved: when it is None (no
    --history-tenant-max-mb), ``max_total_bytes`` split evenly between ``tenants``.

    An even split is what lets no tenant push out another's rows: while every tenant is
    within its share, all of them together are within the total. One tenant (no tenant
    keys) gets the whole total, as before per-tenant caps. The share is never under
    ``max_response_bytes``, so every response the gateway accepts fits its tenant's share
    (with very many tenants the shares may then add up to more than the total, which
    still holds, oldest first). No total cap: no per-tenant cap either.
    """
    if limits.max_tenant_bytes is not None:
        return limits
    if not limits.max_total_bytes:
        return replace(limits, max_tenant_bytes=0)
    share = limits.max_total_bytes // max(tenants, 1)
    return replace(limits, max_tenant_bytes=max(share, limits.max_response_bytes))
