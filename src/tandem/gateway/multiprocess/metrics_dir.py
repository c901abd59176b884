"""One ``/metrics`` for all processes of ``--processes N``: prometheus_client's multiprocess
mode.

The supervisor makes a private temporary directory and names it to every child in
``PROMETHEUS_MULTIPROC_DIR``; prometheus_client reads that variable when it is first
imported and then keeps each metric's values in memory-mapped files there, one per
process. Any child's ``/metrics`` reads all the files and sums them (gauges as their
``multiprocess_mode`` in gateway/metrics.py says), so a scrape on any child shows the whole
gateway; a dead child's counters stay in the sum, its live gauges are dropped. Without the
variable, or with ``--processes 1``, ``/metrics`` is this process's registry, as always.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

ENV = "PROMETHEUS_MULTIPROC_DIR"


def create() -> Path:
    """A fresh directory for one supervisor run (mode 0700: ours alone)."""
    return Path(tempfile.mkdtemp(prefix="tandem-gateway-metrics-"))


def remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def process_gone(path: Path, pid: int) -> None:
    """Drop a dead child's live gauges (its in-flight counts would otherwise linger)."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid, str(path))


def latest(registry: CollectorRegistry, processes: int) -> bytes:
    """The exposition text: every process's metrics when run under a supervisor.

    Keyed on ``--processes``, not on the variable alone: a ``PROMETHEUS_MULTIPROC_DIR``
    left in a single gateway's environment must not pull other programs' files in."""
    if processes <= 1 or not os.environ.get(ENV):
        return generate_latest(registry)
    from prometheus_client import multiprocess

    merged = CollectorRegistry()
    multiprocess.MultiProcessCollector(merged)
    return generate_latest(merged)
