"""The chaos soak (bench/chaos_soak.py), cut to one SIGKILL and restart, so CI sees it work.

Real processes on 127.0.0.1: 2 prefill + 2 decode null-engine workers and a PD gateway,
five clients of mixed traffic for 25 s while the driver kills one worker and starts it
again on its port. The soak's own verdict is checked (nothing lost, no KV held, the
driver did its round), and the round's recovery is bounded loosely (the machine running
CI may be busy; docs/benchmarks.md has the measured figures against the 2 s target).
"""

from __future__ import annotations

import pytest
from bench.chaos_load import KINDS, coded_or_lost, raw_grpc
from bench.chaos_soak import failed, held_total, parse_args, soak

pytestmark = pytest.mark.slow

# Loose on purpose: 2.5 x the 2 s target, so a busy runner does not fail it while
# a regression to the old 17 s recovery still does.
RECOVERY_BOUND_S = 5.0


def test_raw_grpc_words_make_a_coded_error_lost() -> None:
    tandem = '{"message": "the connection to the worker was lost (UNAVAILABLE)"}'
    leaked = '{"message": "Stream removed (Socket closed)"}'
    assert not raw_grpc(tandem)
    assert coded_or_lost("decode_stream_error", tandem)[0] == "coded"
    assert coded_or_lost("decode_stream_error", leaked)[0] == "lost"


@pytest.mark.timeout(150)
def test_one_kill_and_restart_loses_nothing() -> None:
    argv = ["--minutes", "0.42", "--engine", "null", "--seed", "7", "--stop-share", "0"]
    report, gateway_lines = soak(parse_args([*argv, "--gap-s", "6", "8", "--settle-s", "20"]))
    story = f"{report['examples']}\n" + "\n".join(gateway_lines[-30:])

    assert report["chaos_error"] == "", story
    assert report["lost"] == 0, story
    assert held_total(report["kv_held_at_end"]) == 0, report["kv_held_at_end"]
    assert report["gateway_tracebacks"] == 0, story
    assert not failed(report)

    assert set(report["by_kind"]) == set(KINDS)
    assert report["answered"] > report["sent"] // 2, story
    assert [r["signal"] for r in report["restarts"]] == ["SIGKILL"]
    recovery = report["restarts"][0]["recovery_s"]
    assert recovery is not None and recovery < RECOVERY_BOUND_S, report["restarts"]
