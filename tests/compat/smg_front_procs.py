"""Processes for the smg-in-front-of-Tandem compatibility tests, all on 127.0.0.1.

Tandem's workers answer ``tandem.kv.KvTransfer/Stats`` with ``leg_bytes``: bytes and pixel
bytes per PD leg, counted where they arrive. That is how the tests prove what smg put on
each leg.

smg runs from its own virtualenv (``bench.procs.ensure_smg``); it is never imported.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from typing import Any

import grpc
from bench.procs import ensure_smg, free_port
from tests.integration.processes import LIVE, Proc, _pump, wait_ready

HOST = "127.0.0.1"
SMG_READY_S = 90.0  # registration is quick; 90 s bounds a slow, loaded 2-core machine


def spawn(argv: list[str], name: list[str]) -> tuple[Proc, threading.Event]:
    """Start ``argv`` with stdout+stderr merged into a background-collected ``Proc``."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    popen = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    proc = Proc(name, popen)
    LIVE.append(proc)
    ready = threading.Event()
    threading.Thread(target=_pump, args=(proc, ready), daemon=True).start()
    return proc, ready


def start_pd_workers(model: str, *extra: str) -> tuple[Proc, Proc]:
    """A prefill and a decode worker of ``model`` (loaded in parallel), advertising NIXL.

    smg relays KV transfer params only for connectors it knows; Tandem's side channel is
    advertised as ``NixlConnector`` for it, as in the bench.
    """
    started = []
    for role in ("prefill", "decode"):
        args = ["worker", "--role", role, "--model", model, "--host", HOST, "--port", "0"]
        args += ["--kv-connector", "NixlConnector", "--log-level", "info", *extra]
        started.append(spawn([sys.executable, "-m", "tandem.cli", *args], args))
    try:
        prefill, decode = (wait_ready(proc, ready) for proc, ready in started)
    except Exception:
        for proc, _ in started:
            proc.stop(signal.SIGKILL)
        raise
    return prefill, decode


class Smg:
    """One ``smg launch`` in front of Tandem workers: in PD mode over a prefill and a
    decode worker, or over the workers ``worker_args`` name (smg's own flags)."""

    def __init__(
        self,
        prefill: Proc | None,
        decode: Proc | None,
        model: str,
        mm_processing: str,
        worker_args: list[str] | None = None,
    ) -> None:
        self.port, self.metrics_port = free_port(), free_port()
        argv = [str(ensure_smg()), "launch", "--host", HOST, "--port", str(self.port)]
        argv += ["--prometheus-host", HOST, "--prometheus-port", str(self.metrics_port)]
        argv += ["--mm-processing", mm_processing, "--log-level", "warn"]
        argv += ["--shutdown-grace-period-secs", "1"]  # nothing is in flight at teardown
        if worker_args is None:
            assert prefill is not None and decode is not None
            worker_args = ["--pd-disaggregation", "--prefill", f"grpc://{prefill.address}"]
            worker_args += ["--decode", f"grpc://{decode.address}"]
        argv += worker_args
        self.proc, _ = spawn(argv, ["smg", mm_processing, model])
        self.base_url = f"http://{HOST}:{self.port}/v1"
        try:
            self._wait_model(model)
        except Exception:
            self.stop()
            raise

    def _wait_model(self, model: str) -> None:
        """Bounded wait until ``/v1/models`` lists ``model`` (both workers registered)."""
        deadline = time.monotonic() + SMG_READY_S
        while time.monotonic() < deadline:
            if self.proc.popen.poll() is not None:
                raise RuntimeError(f"smg exited:\n{self.proc.output()[-4000:]}")
            try:
                with urllib.request.urlopen(f"{self.base_url}/models", timeout=2) as reply:
                    ids = [m["id"] for m in json.load(reply).get("data", [])]
                if model in ids:
                    return
            except OSError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"smg did not list {model} in {SMG_READY_S}s:\n{self.proc.output()}")

    def stop(self) -> None:
        # Ports are fresh per instance (free_port), so no wait for their release here:
        # the HTTP port sits in TIME_WAIT after the clients' connections anyway.
        self.proc.stop()


def stop_all(*procs: Proc, timeout: float = 15.0) -> None:
    """SIGTERM every process, then wait for all (they shut down in parallel); kill laggards.

    One SIGTERM each: a second one can land after a worker removed its handler.
    """
    for proc in procs:
        if proc.popen.poll() is None:
            proc.popen.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.popen.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.popen.kill()
            proc.popen.wait(60)  # see Proc.stop: a killed torch process can take a while


def worker_stats(worker: Proc) -> dict[str, Any]:
    """The worker's counters from its ``tandem.kv.KvTransfer/Stats`` side-channel RPC."""
    with grpc.insecure_channel(worker.address) as channel:
        rpc = channel.unary_unary(
            "/tandem.kv.KvTransfer/Stats",
            request_serializer=lambda v: json.dumps(v).encode(),
            response_deserializer=json.loads,
        )
        return rpc({}, timeout=10)


def leg(stats: dict[str, Any], name: str) -> dict[str, int]:
    """One leg's counters (``requests``, ``message_bytes``, ``pixel_bytes``, ``shm_bytes``);
    zeros if none."""
    zero = {"requests": 0, "message_bytes": 0, "pixel_bytes": 0, "shm_bytes": 0}
    return {**zero, **stats.get("leg_bytes", {}).get(name, {})}


def wait_for_line(proc: Proc, needle: str, at_least: int = 1, timeout: float = 10.0) -> bool:
    """Whether ``needle`` is in ``at_least`` log lines within ``timeout``.

    A worker's log lines reach the test through a pipe and a reader thread, so a line
    written before the reply was sent may still be on its way when the reply arrives.
    """
    deadline = time.monotonic() + timeout
    while proc.count(needle) < at_least:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def log_problems(proc: Proc) -> list[str]:
    """Lines of a worker's log that show an error: ERROR/CRITICAL records and tracebacks."""
    needles = (" ERROR ", " CRITICAL ", "Traceback (most recent call last)")
    return [line for line in list(proc.lines) if any(n in line for n in needles)]
