"""``bench.paired_ab``'s arithmetic and its clock (no gateways started)."""

from __future__ import annotations

import os
import time

from bench.paired_ab import summary
from bench.procs import run_time_ms


def test_the_change_is_the_mean_of_each_rounds_ratio() -> None:
    result = summary({"A": [10.0, 20.0], "B": [9.0, 19.0]})
    assert result["a_ms"] == 15.0 and result["b_ms"] == 14.0
    assert abs(result["change_pct"] - 100 * ((0.9 + 0.95) / 2 - 1)) < 1e-9
    assert abs(result["ratio_spread_pct"] - 5.0) < 1e-9


def test_run_time_counts_this_process_busy_time_finer_than_a_tick() -> None:
    before = run_time_ms(os.getpid())
    end = time.process_time() + 0.004  # under half a 10 ms tick of busy work
    while time.process_time() < end:
        pass
    spent = run_time_ms(os.getpid()) - before
    assert 2.0 < spent < 500.0
