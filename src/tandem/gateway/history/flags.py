"""The ``--history-*`` and ``--postgres-db-url`` flags of `tandem gateway` → config fields.

Defaults are the config's own (tests/unit/test_cli_defaults.py); sizes are given in MiB.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tandem.gateway.config import GatewayConfig
from tandem.gateway.history.store import HistoryLimits
from tandem.gateway.types import HISTORY_BACKENDS

MiB = 1 << 20
_DEFAULTS = GatewayConfig()
_LIMITS = HistoryLimits()


def _number(kind: type[int] | type[float], minimum: float) -> Callable[[str], int | float]:
    def parse(raw: str) -> int | float:
        try:
            value = kind(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{raw!r} is not a number") from None
        if not value >= minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum:g}, got {raw}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its error messages
    return parse


_non_negative = _number(float, 0)


def _mebibytes(raw: str) -> float:
    """A size in MiB: a number >= 0 whose bytes a 64-bit database integer holds ("inf" or
    1e300 would only fail later, converting to bytes or in the first sweep)."""
    value = float(_non_negative(raw))
    if not math.isfinite(value) or value * MiB >= 2**63:
        raise argparse.ArgumentTypeError(f"must be a size under 8 EiB, got {raw}")
    return value


_mebibytes.__name__ = "float"


def add_history_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--history-backend",
        choices=HISTORY_BACKENDS,
        default=_DEFAULTS.history_backend,
        help="where stored responses (/v1/responses, store: true) live",
    )
    p.add_argument(
        "--history-sqlite-path",
        type=Path,
        default=_DEFAULTS.history_sqlite_path,
        help="the SQLite file (default: $TANDEM_HISTORY_DIR/responses.sqlite3, else "
        "~/.cache/tandem/history/responses.sqlite3)",
    )
    p.add_argument(
        "--postgres-db-url",
        default=_DEFAULTS.postgres_db_url,
        metavar="postgresql://…",
        help="the database of --history-backend postgres (several gateways may share it)",
    )
    p.add_argument(
        "--history-ttl-secs",
        type=_number(float, 0),
        default=_LIMITS.ttl_s or 0,
        help="stored responses older than this are deleted (0: kept until deleted)",
    )
    p.add_argument(
        "--history-max-mb",
        type=_mebibytes,
        default=_LIMITS.max_total_bytes / MiB,
        help="all stored responses together; over it, the oldest go first (0: no cap)",
    )
    p.add_argument(
        "--history-max-response-mb",
        type=_mebibytes,
        default=_LIMITS.max_response_bytes / MiB,
        help="one stored response (input items and images included)",
    )
    p.add_argument(
        "--history-tenant-max-mb",
        type=_mebibytes,
        default=None,  # HistoryLimits.max_tenant_bytes: the even share, resolved at open
        help="one tenant's stored responses; over it, that tenant's oldest go first "
        "(default: --history-max-mb split evenly between the tenants the keys name, at "
        "least --history-max-response-mb; 0: no per-tenant cap)",
    )
    p.add_argument(
        "--history-max-turns",
        type=_number(int, 1),
        default=_LIMITS.max_turns,
        help="the longest conversation previous_response_id may continue",
    )


def history_config_from_args(args: argparse.Namespace) -> dict[str, Any]:
    limits = HistoryLimits(
        ttl_s=args.history_ttl_secs or None,
        max_total_bytes=round(args.history_max_mb * MiB),
        max_response_bytes=round(args.history_max_response_mb * MiB),
        max_tenant_bytes=_bytes_or_none(args.history_tenant_max_mb),
        max_turns=args.history_max_turns,
    )
    return {
        "history_backend": args.history_backend,
        "history_sqlite_path": args.history_sqlite_path,
        "postgres_db_url": args.postgres_db_url,
        "history": limits,
    }


def _bytes_or_none(mib: float | None) -> int | None:
    return None if mib is None else round(mib * MiB)
