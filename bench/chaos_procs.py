"""The chaos soak's processes: four PD workers and a gateway, killed and started again by pid.

Each child's merged stdout/stderr is drained on a thread (so it never blocks on a full
pipe), its last lines kept for reports, its ``Traceback`` lines counted, and the moment
its ready line was read noted: that moment starts a restart's recovery clock.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import grpc

READY = re.compile(r"TANDEM_(?:WORKER|GATEWAY)_READY (\S+)")
MODEL = "tiny-qwen3-vl"
HEALTH_INTERVAL_S = 1.0  # the gateway's --health-check-interval-secs; recovery target 2x this


@dataclass
class Child:
    """One ``python -m tandem.cli`` process and what its output said."""

    name: str
    argv: list[str]
    popen: subprocess.Popen[str]
    address: str = ""
    ready_at: float = 0.0  # time.monotonic() of the ready line
    tracebacks: int = 0
    lines: deque[str] = field(default_factory=lambda: deque(maxlen=3000))
    ready: threading.Event = field(default_factory=threading.Event)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            self.popen.send_signal(sig)

    def kill(self) -> None:
        self.signal(signal.SIGCONT)  # a stopped process cannot die of SIGTERM
        self.signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(10)


def _pump(child: Child) -> None:
    assert child.popen.stdout is not None
    for raw in child.popen.stdout:
        line = raw.rstrip("\n")
        child.lines.append(line)
        if "Traceback" in line:
            child.tracebacks += 1
        match = READY.search(line)
        if match and not child.ready.is_set():
            child.address = match.group(1)
            child.ready_at = time.monotonic()
            child.ready.set()
    child.ready.set()  # ended: wake the waiter


def spawn(name: str, args: list[str]) -> Child:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-m", "tandem.cli", *args]
    popen = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    child = Child(name, args, popen)
    threading.Thread(target=_pump, args=(child,), daemon=True).start()
    return child


def wait_ready(child: Child, timeout: float = 300.0) -> Child:
    if not child.ready.wait(timeout) or not child.address:
        child.kill()
        tail = "\n".join(list(child.lines)[-40:])
        raise RuntimeError(f"{child.name} did not become ready:\n{tail}")
    return child


def worker_args(role: str, port: int, engine: str, token_delay_ms: float) -> list[str]:
    args = ["worker", "--model", MODEL, "--engine", engine, "--role", role]
    args += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    if engine == "embedded":
        args += ["--threads", "1"]  # four workers on a small machine: no thread oversubscription
    else:
        args += ["--null-token-delay-ms", str(token_delay_ms)]
    return args


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def restart(old: Child) -> Child:
    """The same worker again on the same port (the gateway knows it by that address)."""
    args = list(old.argv)
    args[args.index("--port") + 1] = str(port_of(old.address))
    deadline = time.monotonic() + 30
    while True:
        child = wait_ready_or_none(spawn(old.name, args))
        if child is not None:
            return child
        if time.monotonic() > deadline:  # the port never came free: say so, loudly
            raise RuntimeError(f"{old.name} could not start again on {old.address}")
        time.sleep(0.5)


def wait_ready_or_none(child: Child) -> Child | None:
    if child.ready.wait(300) and child.address:
        return child
    child.kill()
    return None


def gateway_args(prefill: list[str], decode: list[str], history: str) -> list[str]:
    args = ["gateway", "--host", "127.0.0.1", "--port", "0", "--pd-disaggregation"]
    for url in prefill:
        args += ["--prefill", url]
    args += ["--decode", *decode]
    args += ["--health-check-interval-secs", str(HEALTH_INTERVAL_S), "--history-backend", "sqlite"]
    args += ["--history-sqlite-path", history, "--no-access-log", "--log-level", "warning"]
    return args


def stats(address: str, timeout: float = 3.0) -> dict[str, Any] | None:
    """The worker's side-channel Stats counters; None when it does not answer in time."""
    with grpc.insecure_channel(address) as channel:
        rpc = channel.unary_unary(
            "/tandem.kv.KvTransfer/Stats",
            request_serializer=lambda v: json.dumps(v).encode(),
            response_deserializer=lambda b: json.loads(b),
        )
        try:
            reply: dict[str, Any] = rpc({}, timeout=timeout)
        except grpc.RpcError:
            return None
        return reply


def finished(counters: dict[str, Any] | None) -> int:
    """Legs the engine finished (the answered ones; errors and aborts are not answers)."""
    if not counters:
        return 0
    return int(counters.get("requests_by_outcome", {}).get("finished", 0))
