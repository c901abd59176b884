"""Start real Tandem processes on 127.0.0.1 for integration tests, and stop them for sure."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field

READY = re.compile(r"TANDEM_(WORKER|GATEWAY)_READY (\S+)")
# TANDEM_TEST_GATEWAY_PROCESSES=N runs every `tandem gateway` of the tests as N processes
# (README, "Tests"), except those given SINGLE_PROCESS: a gateway whose test needs exactly
# one process says so with this and a `# single_process:` comment giving the reason.
GATEWAY_PROCESSES = os.environ.get("TANDEM_TEST_GATEWAY_PROCESSES", "")
SINGLE_PROCESS = ["--processes", "1"]
LIVE: list[Proc] = []  # every process started, so a failing test can show their logs


@dataclass
class Proc:
    """A child process whose output is collected in the background."""

    args: list[str]
    popen: subprocess.Popen
    address: str = ""
    lines: deque = field(default_factory=lambda: deque(maxlen=2000))

    def output(self) -> str:
        return "\n".join(self.lines)

    def count(self, needle: str) -> int:
        return sum(needle in line for line in list(self.lines))

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                # SIGKILL cannot be refused, but on two busy cores the kernel can take more
                # than a few seconds to tear down a process that holds a torch heap (a CI
                # run's teardown timed out after 5 s): wait for it rather than fail the test.
                self.popen.wait(60)
        return self.popen.returncode


def _pump(proc: Proc, ready: threading.Event) -> None:
    assert proc.popen.stdout is not None
    for raw in proc.popen.stdout:
        line = raw.rstrip("\n")
        proc.lines.append(line)
        match = READY.search(line)
        if match and not ready.is_set():
            proc.address = match.group(2)
            ready.set()
    ready.set()  # the process ended: wake the waiter


def start(args: list[str], env: dict[str, str] | None = None) -> tuple[Proc, threading.Event]:
    """Spawn ``python -m tandem.cli ARGS`` with stdout+stderr merged."""
    if args[:1] == ["gateway"] and GATEWAY_PROCESSES and "--processes" not in args:
        args = [*args, "--processes", GATEWAY_PROCESSES]
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    popen = subprocess.Popen(
        [sys.executable, "-m", "tandem.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=full_env,
    )
    proc = Proc(args, popen)
    LIVE.append(proc)
    ready = threading.Event()
    threading.Thread(target=_pump, args=(proc, ready), daemon=True).start()
    return proc, ready


def wait_ready(proc: Proc, ready: threading.Event, timeout: float = 180.0) -> Proc:
    deadline = time.monotonic() + timeout
    if not ready.wait(max(0.0, deadline - time.monotonic())) or not proc.address:
        proc.stop(signal.SIGKILL)
        raise RuntimeError(f"{proc.args} did not become ready:\n{proc.output()[-4000:]}")
    return proc


def start_all(specs: list[list[str]], env: dict[str, str] | None = None) -> list[Proc]:
    """Start several processes at once (they load models in parallel) and wait for all."""
    started = [start(args, env) for args in specs]
    try:
        return [wait_ready(proc, ready) for proc, ready in started]
    except Exception:
        for proc, _ in started:
            proc.stop(signal.SIGKILL)
        raise
