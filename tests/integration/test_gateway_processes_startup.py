"""``tandem gateway --processes N`` at start-up and under ``tandem serve``: what is refused
before anything serves, what ``--processes 1`` leaves as it was, and ``tandem serve
--processes 2`` serving and stopping every gateway process. Real processes throughout
(a null-engine worker where the model does not matter, the built-in model under serve).
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from .multiprocess_probe import (
    METRICS_ENV,
    NULL,
    TWO,
    alive,
    child_pids,
    environ,
    gateway_args,
    metric,
    post_chat,
)
from .processes import start, start_all

pytestmark = pytest.mark.slow


def test_one_process_keeps_the_plain_registry(model_cache: Path, tmp_path: Path) -> None:
    (worker,) = start_all([NULL])
    args = gateway_args(worker, tmp_path)
    args[args.index("--processes") + 1] = "1"
    (gateway,) = start_all([args])
    try:
        assert child_pids(gateway.popen.pid) == []  # it serves itself, no children
        assert METRICS_ENV not in environ(gateway.popen.pid)
        assert post_chat(gateway.address).status_code == 200
        assert metric(gateway.address, "tandem_requests_total", route="chat") == 1.0
        # The admin API works as ever: a removal of an unknown worker is its own 404.
        removed = httpx.delete(f"{gateway.address}/workers", params={"url": "x"}, timeout=10)
        assert removed.json()["error"]["code"] == "worker_not_found"
    finally:
        gateway.stop()
        worker.stop()


@pytest.mark.parametrize("command", ["gateway", "serve"])
def test_memory_history_is_refused_with_several_processes(command: str) -> None:
    args = [command, "--processes", "2", "--history-backend", "memory"]
    if command == "gateway":
        args += ["--worker-urls", "127.0.0.1:1"]
    done = subprocess.run(
        [sys.executable, "-m", "tandem.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "--history-backend memory" in done.stderr and "--processes" in done.stderr
    assert "Traceback" not in done.stderr


def test_an_unanswering_worker_ends_the_run_at_once() -> None:
    args = ["gateway", "--port", "0", "--worker-urls", "127.0.0.1:1", *TWO]
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "tandem.cli", *args], capture_output=True, text=True, timeout=90
    )
    assert done.returncode == 1
    assert "did not answer" in done.stderr and "Traceback" not in done.stderr
    # Asked once by the supervisor, not once per child and start-up attempt.
    assert "restarting it in" not in done.stdout + done.stderr
    assert time.monotonic() - started < 60


def test_serve_passes_processes_on_and_stops_every_gateway_process(
    model_cache: Path, tmp_path: Path
) -> None:
    store = ["--history-sqlite-path", str(tmp_path / "h.sqlite3")]
    (serve, _ready) = start(["serve", "--port", "0", "--aggregated", "--processes", "2", *store])
    try:
        deadline = time.monotonic() + 120
        while not (ready := re.search(r"TANDEM_SERVE_READY (\S+)", serve.output())):
            assert serve.popen.poll() is None and time.monotonic() < deadline, serve.output()
            time.sleep(0.2)
        base = ready.group(1).removesuffix("/v1")
        gateway_pid = int(re.findall(r"^TANDEM_CHILD gateway (\d+)$", serve.output(), re.M)[0])
        processes = child_pids(gateway_pid)
        assert len(processes) == 2
        responses = [post_chat(base) for _ in range(8)]
        assert [r.status_code for r in responses] == [200] * 8
    finally:
        code = serve.stop(signal.SIGINT, timeout=30)
    assert code == 0, serve.output()[-3000:]
    assert not [pid for pid in processes if alive(pid)]
