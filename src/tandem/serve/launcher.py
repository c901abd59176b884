"""Start the workers and then the gateway of `tandem serve`, watch them, and stop them all.

The launcher owns every child: whatever ends the run (Ctrl-C, SIGTERM, a child dying, a
startup timeout, an exception), `_shutdown` runs and leaves no process behind.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from tandem.gateway.types import MmProcessingMode, WorkerStreamClient
from tandem.serve.children import Child, Console
from tandem.serve.examples import banner

HOST = "127.0.0.1"  # loopback only: `tandem serve` is a local deployment
STARTUP_TIMEOUT_S = 600.0  # a large local checkpoint on CPU can take minutes to load
GATEWAY_GRACE_S = 5.0
TOTAL_GRACE_S = 10.0  # after this, SIGKILL


@dataclass(frozen=True, slots=True)
class Plan:
    """What to start; ``model`` is a built-in name or an absolute checkpoint path."""

    model: str
    prefill: int
    decode: int
    aggregated: bool
    decode_language_model_only: bool
    mm_processing: MmProcessingMode
    port: int
    log_level: str
    image: Path
    notes: tuple[str, ...] = ()
    expected_reply: str | None = None  # what the model answers the banner's examples
    history_args: tuple[str, ...] = ()  # the gateway's --history-* flags, passed on as given
    gateway_processes: int = 1  # the gateway's --processes
    worker_stream_client: WorkerStreamClient = "h2"  # the gateway's --worker-stream-client

    def worker_specs(self) -> list[tuple[str, list[str]]]:
        base = ["worker", "--model", self.model, "--host", HOST, "--port", "0"]
        base += ["--log-level", self.log_level]
        if self.aggregated:
            return [(f"worker-{i}", [*base, "--role", "both"]) for i in range(self.decode)]
        lmo = ["--language-model-only"] if self.decode_language_model_only else []
        prefill = [(f"prefill-{i}", [*base, "--role", "prefill"]) for i in range(self.prefill)]
        decode = [(f"decode-{i}", [*base, "--role", "decode", *lmo]) for i in range(self.decode)]
        return prefill + decode

    def gateway_args(self, workers: list[Child]) -> list[str]:
        args = ["gateway", "--host", HOST, "--port", str(self.port)]
        args += ["--mm-processing", self.mm_processing, "--log-level", self.log_level]
        args += ["--worker-stream-client", self.worker_stream_client]
        args += self.history_args
        if self.gateway_processes > 1:
            args += ["--processes", str(self.gateway_processes)]
        if self.aggregated:
            return [*args, "--worker-urls", *(w.address for w in workers)]
        prefill = [w.address for w in workers if w.role.startswith("prefill-")]
        decode = [w.address for w in workers if w.role.startswith("decode-")]
        return [*args, "--pd-disaggregation", "--prefill", *prefill, "--decode", *decode]


def _get_json(url: str) -> object | None:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as response:
            return json.loads(response.read())
    except (OSError, ValueError):
        return None  # not up yet (connection refused, 503 → HTTPError is an OSError)


class Launcher:
    def __init__(self, plan: Plan, console: Console) -> None:
        self.plan = plan
        self.console = console
        self.children: list[Child] = []
        self.wake = threading.Event()  # cuts the watch loop's sleep short
        self.stop = threading.Event()  # Ctrl-C or SIGTERM arrived
        self.hurry = threading.Event()  # a second one: skip the remaining grace

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.stop.is_set():
            self.hurry.set()
        self.stop.set()
        self.wake.set()

    def info(self, message: str) -> None:
        if self.plan.log_level.lower() in ("debug", "info"):
            self.console.line(f"[serve] {message}")

    def error(self, message: str) -> None:
        print(f"tandem serve: {message}", file=sys.stderr, flush=True)

    def run(self) -> int:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)
        try:
            return self._serve()
        finally:
            self._shutdown()

    def _spawn(self, role: str, args: list[str]) -> Child:
        child = Child(role, args, self.console, self.wake)
        self.children.append(child)
        child.start()
        return child

    def _serve(self) -> int:
        plan = self.plan
        # All workers load the model at the same time; the gateway needs their addresses.
        workers = [self._spawn(role, args) for role, args in plan.worker_specs()]
        status = self._watch(lambda: all(w.ready.is_set() for w in workers), "the workers")
        if status is not None:
            return status
        self.info("workers ready: " + ", ".join(f"{w.role}={w.address}" for w in workers))
        gateway = self._spawn("gateway", plan.gateway_args(workers))

        def gateway_healthy() -> bool:
            return gateway.ready.is_set() and _get_json(gateway.address + "/health") is not None

        status = self._watch(gateway_healthy, "the gateway")
        if status is not None:
            return status
        base_url = gateway.address
        models = _get_json(base_url + "/v1/models")
        served = models.get("data") if isinstance(models, dict) else None
        model = served[0]["id"] if served else plan.model
        notes = list(plan.notes)
        self.console.line(banner(base_url, model, plan.image, notes, plan.expected_reply))
        self.console.line(f"TANDEM_SERVE_READY {base_url}")
        status = self._watch(None, "")
        return 0 if status is None else status

    def _watch(self, condition: Callable[[], bool] | None, what: str) -> int | None:
        """Wait for ``condition`` (None: forever). None when it holds, else the exit code."""
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if self.stop.is_set():
                self.info("stopping (signal received)")
                return 0
            for child in self.children:
                if not child.running():
                    child.finish_output()
                    self.error(child.describe_exit())
                    self.error("stopping the other processes")
                    return 1
            if condition is not None:
                if condition():
                    return None
                if time.monotonic() > deadline:
                    self.error(f"{what} did not become ready within {STARTUP_TIMEOUT_S:.0f} s")
                    return 1
            self.wake.wait(0.25)
            self.wake.clear()

    def _shutdown(self) -> None:
        if not self.children:
            return
        start = time.monotonic()
        gateways = [c for c in self.children if c.role == "gateway"]
        workers = [c for c in self.children if c.role != "gateway"]
        # The gateway goes first, so that its last moments are not spent on vanished workers.
        for phase, deadline in (
            (gateways, start + GATEWAY_GRACE_S),
            (workers, start + TOTAL_GRACE_S),
        ):
            for child in phase:
                child.send(signal.SIGTERM)
            for child in phase:
                child.wait_until(deadline, self.hurry)
        for child in self.children:
            if child.running():
                self.error(f"{child.role} (pid {child.pid}) did not stop in time; killing it")
                child.kill()
            child.finish_output()
        self.info("all processes stopped")
