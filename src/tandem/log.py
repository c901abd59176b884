"""One logger per subsystem, configured once per process."""

from __future__ import annotations

import logging
import sys

DEFAULT_LOG_LEVEL = "info"  # every command's --log-level


def setup_logging(level: str = DEFAULT_LOG_LEVEL, role: str | None = None) -> None:
    """Log to stderr; a ``role`` prefix tells child processes apart in `tandem serve`."""
    prefix = f"[{role}] " if role else ""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter(f"{prefix}%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
