"""Processes of the side-by-side bench: null workers, the Tandem gateway and smg, on loopback.

smg (PyPI ``smg``, pinned below) lives in its own virtualenv outside the repository, made on
first use and reused; it is never a dependency of Tandem. Every process is started with
``taskset`` on the CPUs it is given and stopped by its own pid.
"""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tandem.hostport import join_host_port

SMG_VERSION = "1.13.0"
BENCH_HOME = Path(os.environ.get("TANDEM_BENCH_HOME", Path.home() / ".cache/tandem/bench"))
SMG_VENV = BENCH_HOME / "smg-venv"
READY = re.compile(r"TANDEM_(?:WORKER|GATEWAY)_READY (\S+)")
HOST = "127.0.0.1"


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    address: str = ""
    lines: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(60)  # the kernel's reap of a large heap can be slow


def ensure_smg() -> Path:
    """The smg launcher, installing ``smg==SMG_VERSION`` into its own venv when missing."""
    smg = SMG_VENV / "bin" / "smg"
    if smg.exists():
        return smg
    BENCH_HOME.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(SMG_VENV)], check=True)
    pip = [str(SMG_VENV / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, f"smg=={SMG_VERSION}"], check=True, timeout=600)
    return smg


def smg_version() -> str:
    out = subprocess.run(
        [str(SMG_VENV / "bin" / "python"), "-m", "pip", "show", "smg"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    match = re.search(r"^Version: (\S+)", out, re.M)
    return match.group(1) if match else "unknown"


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A loopback port nothing listens on, for a child process to bind later.

    Picked outside the kernel's ephemeral range: a port from ``bind(0)`` can be handed to
    another process's own ``bind(0)`` or outgoing connection between our close and the
    child's bind (CI saw a vLLM engine die of "Address already in use" that way).
    """
    low, high = _ephemeral_range()
    pool = range(20000, low) if low > 21000 else range(high + 1, 65536)
    for _ in range(200):
        port = random.choice(pool)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind((HOST, port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError(f"no free loopback port in {pool}")


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def wait_port_free(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            try:
                s.bind((HOST, port))
                return
            except OSError:
                time.sleep(0.2)
    raise RuntimeError(f"port {port} still in use after {timeout}s")


def spawn(name: str, cpus: str, argv: list[str], ready: re.Pattern | None) -> Proc:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    popen = subprocess.Popen(
        ["taskset", "-c", cpus, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    proc = Proc(name, popen)
    event = threading.Event()

    def pump() -> None:
        assert popen.stdout is not None
        for line in popen.stdout:
            if len(proc.lines) < 400:
                proc.lines.append(line.rstrip())
            match = ready.search(line) if ready else None
            if match and not event.is_set():
                proc.address = match.group(1)
                event.set()
        event.set()

    threading.Thread(target=pump, daemon=True).start()
    proc.ready = event  # type: ignore[attr-defined]
    return proc


def wait_ready(proc: Proc, timeout: float = 180.0) -> Proc:
    if not proc.ready.wait(timeout) or not proc.address:  # type: ignore[attr-defined]
        proc.stop()
        raise RuntimeError(f"{proc.name} did not start:\n" + "\n".join(proc.lines[-30:]))
    return proc


def start_worker(
    role: str, cpus: str, token_delay_ms: float, model: str, *, media_refs: bool = False
) -> Proc:
    """A null-engine worker; ``media_refs``: it processes worker-path media itself."""
    processor = "inprocess" if media_refs else "off"
    argv = [sys.executable, "-m", "tandem.cli", "worker", "--engine", "null", "--role", role]
    argv += ["--model", model, "--mm-processor", processor, "--kv-connector", "NixlConnector"]
    argv += ["--null-token-delay-ms", str(token_delay_ms), "--log-level", "warning"]
    return spawn(f"worker-{role}", cpus, argv, READY)


def pd_or_agg(urls: dict[str, str], scheme: str = "") -> list[str]:
    if "both" in urls:
        return ["--worker-urls", scheme + urls["both"]]
    prefill, decode = scheme + urls["prefill"], scheme + urls["decode"]
    return ["--pd-disaggregation", "--prefill", prefill, "--decode", decode]


def start_tandem(urls: dict[str, str], cpus: str, *extra: str, name: str = "tandem") -> Proc:
    argv = [sys.executable, "-m", "tandem.cli", "gateway", "--port", "0", "--host", HOST]
    argv += ["--mm-processing", "router", "--log-level", "warning", *pd_or_agg(urls), *extra]
    return wait_ready(spawn(name, cpus, argv, READY))


SMG_INLINE = ("--multimodal-tensor-transport", "inline", "--mm-pixel-cache-mb", "0")


def start_smg(
    urls: dict[str, str],
    cpus: str,
    port: int,
    metrics_port: int,
    extra: tuple[str, ...] = SMG_INLINE,
    name: str = "smg",
) -> Proc:
    wait_port_free(port)
    wait_port_free(metrics_port)
    argv = [str(ensure_smg()), "launch", "--host", HOST, "--port", str(port)]
    argv += ["--prometheus-host", HOST, "--prometheus-port", str(metrics_port)]
    argv += ["--mm-processing", "router", *extra]
    argv += ["--log-level", "warn", *pd_or_agg(urls, "grpc://")]
    proc = spawn(name, cpus, argv, None)
    proc.address = f"http://{join_host_port(HOST, port)}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            raise RuntimeError("smg exited:\n" + "\n".join(proc.lines[-30:]))
        try:
            with urllib.request.urlopen(f"{proc.address}/v1/models", timeout=2) as reply:
                if b'"id"' in reply.read():
                    return proc
        except OSError:
            pass
        time.sleep(0.5)
    proc.stop()
    raise RuntimeError("smg did not become ready:\n" + "\n".join(proc.lines[-30:]))


def tree_pids(pid: int) -> list[int]:
    """``pid`` and its descendants (smg's launcher may run the router as a child)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo.extend(children.get(current, []))
    return out


def run_time_ms(pid: int) -> float:
    """CPU milliseconds of ``pid``'s threads and descendants, to the microsecond: the
    scheduler's ``se.sum_exec_runtime`` of each live thread (``/proc/*/task/*/sched``),
    where :func:`cpu_seconds` counts 10 ms ticks. A thread that has exited is missed."""
    total = 0.0
    for p in tree_pids(pid):
        for sched in Path(f"/proc/{p}/task").glob("*/sched"):
            try:
                text = sched.read_text()
            except OSError:
                continue
            for line in text.splitlines():
                if line.startswith("se.sum_exec_runtime"):
                    total += float(line.rsplit(":", 1)[1])
                    break
    return total


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its descendants."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for p in tree_pids(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / tick


def rss_bytes(pid: int) -> int:
    """Resident set of ``pid`` and its descendants, from /proc/*/status."""
    total = 0
    for p in tree_pids(pid):
        try:
            status = Path(f"/proc/{p}/status").read_text()
        except OSError:
            continue
        match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
        total += int(match.group(1)) * 1024 if match else 0
    return total


def http_get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as reply:
        return reply.read().decode()
