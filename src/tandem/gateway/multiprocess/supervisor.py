"""The supervisor of ``tandem gateway --processes N``: start N gateway children on one port,
print one ready line, restart a child that dies, drain them all on SIGTERM/SIGINT.

The supervisor itself serves nothing and imports little: it holds a bound (never
listening) SO_REUSEPORT socket so that the port is chosen once (``--port 0``) and stays
ours while children come and go, relays the children's output, and watches them. A child
that ends before it ever listened counts as a start-up failure; ``STARTUP_FAILURES`` of
those in a row for one child end the run with exit code 1 (a fault that repeats, such as
a worker that does not answer, would only loop). A child that dies later is restarted
after a back-off that doubles per quick death, and the death is logged.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from tandem.gateway.config import GatewayConfig
from tandem.gateway.multiprocess import metrics_dir
from tandem.gateway.multiprocess.shared_limits import check_shares
from tandem.hostport import bare_host, join_host_port
from tandem.parent_watch import PARENT_ENV

log = logging.getLogger("tandem.gateway.supervisor")
READY_PREFIX = "TANDEM_GATEWAY_READY "
STARTUP_FAILURES = 3
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 10.0
STABLE_AFTER_S = 30.0  # a child that lived this long starts its back-off afresh
STOP_GRACE_S = 10.0  # past the drain timeout, before SIGKILL
POLL_S = 0.1


@dataclass
class Slot:
    """One of the N children, across its restarts."""

    index: int
    popen: subprocess.Popen[str] | None = None
    ready: threading.Event = field(default_factory=threading.Event)
    started_at: float = 0.0
    quick_deaths: int = 0  # ended before listening, or soon after, in a row
    restart_at: float | None = None


class Supervisor:
    def __init__(self, config: GatewayConfig, log_level: str, event_loop: str) -> None:
        check_shares(config)
        self.config = config
        self.log_level = log_level
        self.event_loop = event_loop
        self.slots = [Slot(i) for i in range(config.processes)]
        self.stop = threading.Event()
        self.workdir = Path()  # made by run(), removed when it returns
        self.port = 0

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.stop.is_set():  # a second signal: pass it on, the children hurry
            self._signal_all(signal.SIGTERM)
        self.stop.set()

    def run(self) -> int:
        from tandem.gateway.server import bind

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)
        try:
            holder = bind(self.config.host, self.config.port, reuse_port=True)
        except OSError as exc:
            address = join_host_port(self.config.host, self.config.port)
            print(f"tandem gateway: error: cannot bind {address}: {exc}", file=sys.stderr)
            return 1
        self.port = holder.getsockname()[1]
        if _already_served(self.config.host, self.port):
            # SO_REUSEPORT lets a second supervisor of ours bind the same port, and the
            # kernel would then split the traffic between two unrelated gateways.
            address = join_host_port(self.config.host, self.port)
            print(f"tandem gateway: error: {address} is already being served", file=sys.stderr)
            holder.close()
            return 1
        self.workdir = metrics_dir.create()
        try:
            return self._supervise(self._write_config())
        finally:
            self._stop_all()
            holder.close()
            metrics_dir.remove(self.workdir)

    def _write_config(self) -> Path:
        path = self.workdir / "config.pickle"
        # Created 0600 from the start: API keys and the database URL are inside.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(pickle.dumps(self.config))
        return path

    def _supervise(self, config_path: Path) -> int:
        for slot in self.slots:
            self._spawn(slot, config_path)
        announced = False
        while not self.stop.is_set():
            now = time.monotonic()
            for slot in self.slots:
                ended = slot.popen is not None and slot.popen.poll() is not None
                if ended and not self._child_ended(slot, now):
                    return 1
                if slot.restart_at is not None and now >= slot.restart_at:
                    self._spawn(slot, config_path)
            if not announced and all(s.ready.is_set() for s in self.slots):
                announced = True
                address = join_host_port(self.config.host, self.port)
                log.info("%d gateway processes serving on http://%s", len(self.slots), address)
                print(f"{READY_PREFIX}http://{address}", flush=True)
            self.stop.wait(POLL_S)
        return self._stop_all()

    def _child_ended(self, slot: Slot, now: float) -> bool:
        """Plan the restart of a child that ended; False: give up (it keeps failing)."""
        assert slot.popen is not None
        code, pid, was_ready = slot.popen.returncode, slot.popen.pid, slot.ready.is_set()
        slot.popen = None
        metrics_dir.process_gone(self.workdir, pid)
        quick = not was_ready or now - slot.started_at < STABLE_AFTER_S
        slot.quick_deaths = slot.quick_deaths + 1 if quick else 0
        if not was_ready and slot.quick_deaths >= STARTUP_FAILURES:
            log.error(
                "gateway process %d ended %d times before listening (last exit %s); stopping",
                slot.index,
                slot.quick_deaths,
                code,
            )
            return False
        delay = min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** max(0, slot.quick_deaths - 1))
        log.warning(
            "gateway process %d (pid %d) exited with %s; restarting it in %.1fs",
            slot.index,
            pid,
            code,
            delay,
        )
        slot.restart_at = now + delay
        return True

    def _spawn(self, slot: Slot, config_path: Path) -> None:
        env = {
            **os.environ,
            metrics_dir.ENV: str(self.workdir),
            PARENT_ENV: str(os.getpid()),  # the child ends with us (parent_watch.py)
            "PYTHONUNBUFFERED": "1",
        }
        args = [str(config_path), str(slot.index), str(self.port)]
        args += [self.log_level, self.event_loop]
        slot.popen = subprocess.Popen(
            [sys.executable, "-m", "tandem.gateway.multiprocess.child", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        slot.ready = threading.Event()
        slot.started_at = time.monotonic()
        slot.restart_at = None
        threading.Thread(
            target=_relay, args=(slot.popen, slot.ready), name=f"relay-{slot.index}", daemon=True
        ).start()

    def _signal_all(self, sig: int) -> None:
        for slot in self.slots:
            if slot.popen is not None and slot.popen.poll() is None:
                slot.popen.send_signal(sig)

    def _stop_all(self) -> int:
        """SIGTERM every child, wait for their drains; 0 when every one ended cleanly."""
        self._signal_all(signal.SIGTERM)
        deadline = time.monotonic() + self.config.drain_timeout_s + STOP_GRACE_S
        clean = True
        for slot in self.slots:
            if slot.popen is None:
                continue
            try:
                code = slot.popen.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.error("gateway process %d did not stop; killing it", slot.index)
                slot.popen.kill()
                code = slot.popen.wait()
            clean = clean and code == 0
            slot.popen = None
        return 0 if clean else 1


def _already_served(host: str, port: int) -> bool:
    """Whether something listens on ``host:port`` already (a wildcard host: its loopback)."""
    target = bare_host(host)
    target = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(target, target)
    try:
        with socket.create_connection((target, port), timeout=0.5):
            return True
    except OSError:
        return False


def _relay(popen: subprocess.Popen[str], ready: threading.Event) -> None:
    """Echo a child's lines as ours; its ready line is held back (the supervisor prints
    the one line, once every child listens)."""
    assert popen.stdout is not None
    for line in popen.stdout:
        if line.startswith(READY_PREFIX):
            ready.set()
            continue
        sys.stdout.write(line)
        sys.stdout.flush()


def run_supervisor(config: GatewayConfig, log_level: str, event_loop: str) -> int:
    try:
        supervisor = Supervisor(config, log_level, event_loop)
    except ValueError as exc:
        raise SystemExit(f"tandem gateway: error: {exc}") from None
    # --backend auto is asked once, here: a worker that does not answer ends the run at once
    # with the single gateway's message (not after STARTUP_FAILURES tries of every child),
    # and every child serves the same protocol.
    from tandem.gateway.backend import resolved_backend

    supervisor.config = asyncio.run(resolved_backend(config))
    return supervisor.run()
