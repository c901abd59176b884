"""The child processes of `tandem serve`: spawn one, echo its lines with a role prefix, stop it.

Each child's stdout and stderr are merged into one pipe that a thread reads line by line.
The thread also notices the child's READY line (its address) and keeps the last lines, so
that a child that dies can be reported with the end of its log.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from typing import TextIO

from tandem.parent_watch import PARENT_ENV

READY = re.compile(r"TANDEM_(?:WORKER|GATEWAY)_READY (\S+)")
# Children already tag their log lines ("[worker:prefill] ", "[gateway] "); ours is more
# precise (it numbers the workers), so theirs is dropped rather than printed twice.
OWN_TAG = re.compile(r"^\[(?:worker:\w+|gateway)\] ")
TAIL_LINES = 40


class Console:
    """Writes whole lines to one stream from many threads without interleaving them."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream or sys.stdout
        self._lock = threading.Lock()

    def line(self, text: str) -> None:
        with self._lock:
            try:
                self._stream.write(text + "\n")
                self._stream.flush()
            except (OSError, ValueError):
                pass  # our stdout went away (a closed pipe): keep serving, stop echoing


class Child:
    """One `python -m tandem.cli ...` process, named by its role (``prefill-0``, ``gateway``)."""

    def __init__(self, role: str, args: list[str], console: Console, wake: threading.Event):
        self.role = role
        self.args = args
        self.console = console
        self.wake = wake  # set on anything the launcher must look at: ready, output end
        self.ready = threading.Event()
        self.address = ""
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.popen: subprocess.Popen[str] | None = None
        self._pump: threading.Thread | None = None

    def start(self) -> None:
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",  # lines must reach us as they happen
            PARENT_ENV: str(os.getpid()),  # the child ends with us, even if we are SIGKILLed
        }
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "tandem.cli", *self.args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            env=env,
        )
        # A machine-readable line, so tests and scripts can check that every child is gone.
        self.console.line(f"TANDEM_CHILD {self.role} {self.popen.pid}")
        self._pump = threading.Thread(target=self._echo, name=f"log-{self.role}", daemon=True)
        self._pump.start()

    def _echo(self) -> None:
        assert self.popen is not None and self.popen.stdout is not None
        for raw in self.popen.stdout:
            line = raw.rstrip("\n")
            self.tail.append(line)
            self.console.line(f"[{self.role}] {OWN_TAG.sub('', line)}")
            match = READY.search(line)
            if match and not self.ready.is_set():
                self.address = match.group(1)
                self.ready.set()
                self.wake.set()
        self.wake.set()

    @property
    def pid(self) -> int:
        return self.popen.pid if self.popen is not None else -1

    def returncode(self) -> int | None:
        """None while running (or never started)."""
        return self.popen.poll() if self.popen is not None else None

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def send(self, sig: int) -> None:
        if self.running():
            try:
                assert self.popen is not None
                self.popen.send_signal(sig)
            except ProcessLookupError:
                pass  # it ended between the check and the signal

    def wait_until(self, deadline: float, hurry: threading.Event) -> bool:
        """Wait for the exit until ``deadline`` (monotonic) or ``hurry``; True if it exited."""
        while self.running() and time.monotonic() < deadline and not hurry.is_set():
            time.sleep(0.05)
        return not self.running()

    def kill(self) -> None:
        self.send(signal.SIGKILL)
        if self.popen is not None:
            # SIGKILL cannot be refused; only the kernel's reap of a large heap takes time.
            self.popen.wait(60)

    def finish_output(self, timeout: float = 2.0) -> None:
        """Let the reader drain the pipe, so the tail and the echo are complete."""
        if self._pump is not None:
            self._pump.join(timeout)

    def describe_exit(self) -> str:
        code = self.returncode()
        how = (
            f"was killed by signal {-code}" if code is not None and code < 0 else f"exited ({code})"
        )
        tail = "\n".join(f"    {line}" for line in self.tail) or "    (no output)"
        return f"{self.role} (pid {self.pid}) {how}; last lines of its log:\n{tail}"
