"""A worker told to stop (SIGTERM) shuts down and exits 0, even right after it said ready.

Real ``tandem worker`` processes. A supervisor may stop a worker the moment it reports
ready (a rolling restart that changed its mind, a test's quick teardown); the worker must
then still run its own shutdown rather than die of the signal, and say so in its log.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from .processes import start, wait_ready

NULL = ["worker", "--engine", "null", "--mm-processor", "off"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_stop_right_after_ready_is_a_clean_exit(model_cache: Path, sig: int) -> None:
    proc, ready = start(NULL)
    wait_ready(proc, ready)
    # No request, no pause: the signal follows the ready line as closely as it can.
    code = proc.stop(sig, timeout=30)
    assert code == 0, proc.output()[-4000:]
    assert proc.count("worker shutting down") == 1


def test_stop_after_serving_a_model_is_a_clean_exit(model_cache: Path) -> None:
    # The built-in model's engine (torch heap, compile pool) as well as the null engine.
    proc, ready = start(["worker", "--role", "both"])
    wait_ready(proc, ready)
    assert proc.stop(timeout=30) == 0, proc.output()[-4000:]
    assert proc.count("worker shutting down") == 1
