"""Real vLLM CPU workers (``vllm serve --grpc``) and Tandem gateways in front of them, on 127.0.0.1.

Each vLLM worker runs in its own session so that teardown can stop the whole process
group (vLLM forks an engine core and a model worker). Settings chosen for a 2-core CI
machine, each for a reason:

* ``--dtype float32`` and the checkpoint's real weights: vLLM then holds exactly the model
  Tandem's embedded engine holds, so their greedy tokens can be compared.
* ``--kv-cache-memory-bytes``: the CPU backend otherwise reserves a fraction of the memory
  node up front and refuses to start when that much is not free.
* ``SMG_VLLM_SERVICER_WARMUP=off``: the servicer's planned warm-up pushes ≈ 35 000 prompt
  tokens through the engine; on two cores in PD mode it outlasts the tests it would speed up.
* ``--structured-outputs-config`` backend ``xgrammar``: Tandem's engine constrains decoding
  with xgrammar, and vLLM's default ("auto") falls back to guidance or outlines for what
  xgrammar refuses; pinned, a request xgrammar cannot compile fails on both engines alike.
* ``--kv-events-config`` off unless a test subscribes (``kv_events=True``): left to the
  servicer, the publisher would bind a ZMQ socket on every interface; on, it binds IPC
  sockets in a folder of its own, and the servicer relays them over ``SubscribeKvEvents``.
* NIXL's side channel on 127.0.0.1 with a distinct port per engine.
* ``VLLM_CPU_OMP_THREADS_BIND=nobind`` and one OpenMP thread per engine: by default every
  engine pins its model worker's OpenMP threads to the same CPU (vLLM reserves the other one
  for "the rest"), so with four engines on two cores a forward pass of a tiny model took
  seconds and NIXL handshakes timed out.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.procs import free_port
from tests.integration.processes import LIVE, Proc, start, wait_ready

from .vllm_env import ensure_vllm_venv

HOST = "127.0.0.1"
READY_LINE = "gRPC server started on"
START_TIMEOUT_S = 420.0  # a cold start on a loaded 2-core machine; ≈ 50 s when quiet
NIXL = {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "cpu"}


@dataclass
class VllmWorker:
    """One ``vllm serve DIR --grpc`` process group and its collected log."""

    name: str
    proc: Proc
    port: int
    ready: threading.Event = field(default_factory=threading.Event)

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    def log_count(self, needle: str) -> int:
        return self.proc.count(needle)

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> VllmWorker:
        if not self.ready.wait(timeout) or self.proc.popen.poll() is not None:
            self.stop()
            raise RuntimeError(f"vLLM {self.name} did not start:\n{self.proc.output()[-6000:]}")
        return self

    def stop(self) -> None:
        if self.proc.popen.poll() is None:
            try:
                os.killpg(self.proc.popen.pid, signal.SIGTERM)
                self.proc.popen.wait(30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        with contextlib.suppress(ProcessLookupError):  # engine core, model worker
            os.killpg(self.proc.popen.pid, signal.SIGKILL)
        if self.proc.popen.poll() is None:
            self.proc.popen.wait(60)  # reaping a killed torch heap can be slow on CI


def start_vllm(
    name: str,
    model_dir: Path,
    served_name: str,
    *,
    pd: bool = False,
    language_model_only: bool = False,
    media_refs: bool = False,
    kv_events: bool = False,
    block_size: int | None = None,
) -> VllmWorker:
    """Start (not wait for) one vLLM gRPC worker; ``wait_ready`` on the result."""
    vllm = ensure_vllm_venv()
    port = free_port()
    argv = [str(vllm), "serve", str(model_dir), "--grpc", "--host", HOST, "--port", str(port)]
    argv += ["--dtype", "float32", "--enforce-eager", "--served-model-name", served_name]
    argv += ["--kv-cache-memory-bytes", str(256 << 20), "--max-model-len", "4096"]
    argv += ["--kv-events-config", json.dumps(_kv_events_config(kv_events))]
    if block_size is not None:
        argv += ["--block-size", str(block_size)]
    argv += ["--structured-outputs-config", json.dumps({"backend": "xgrammar"})]
    env = {
        "SMG_VLLM_SERVICER_WARMUP": "off",
        "VLLM_NIXL_SIDE_CHANNEL_HOST": HOST,
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port()),
        # NIXL's UCX back end: loopback TCP only. Left to itself it also tries the host's
        # other interfaces and shared-memory transports, and its first handshake then
        # stalled for tens of seconds (or failed) on a loaded 2-core machine.
        "UCX_NET_DEVICES": "lo",
        "UCX_TLS": "tcp,self",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
    }
    if pd:
        argv += ["--kv-transfer-config", json.dumps(NIXL)]
    if language_model_only:
        argv.append("--language-model-only")
    if media_refs:
        env["SMG_VLLM_MM_PROCESSOR"] = "inprocess"
    popen = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **env},
        start_new_session=True,
    )
    proc = Proc([f"vllm-{name}", str(model_dir)], popen)
    LIVE.append(proc)
    worker = VllmWorker(name, proc, port)
    threading.Thread(target=_pump_until_ready, args=(worker,), daemon=True).start()
    return worker


def _kv_events_config(on: bool) -> dict[str, object]:
    if not on:
        return {"enable_kv_cache_events": False}
    # vLLM binds only wildcard and ipc endpoints (a tcp one with a host it connects to, and
    # the servicer's relay connects too: nobody would listen), so: ipc, in a fresh folder.
    folder = tempfile.mkdtemp(prefix="tandem-vllm-kv-")
    return {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"ipc://{folder}/events",
        "replay_endpoint": f"ipc://{folder}/replay",
    }


def _pump_until_ready(worker: VllmWorker) -> None:
    assert worker.proc.popen.stdout is not None
    for raw in worker.proc.popen.stdout:
        line = raw.rstrip("\n")
        worker.proc.lines.append(line)
        if READY_LINE in line:
            worker.ready.set()
    worker.ready.set()  # it ended: wake the waiter, which sees the exit


def start_gateway(workers: dict[str, VllmWorker], *extra: str) -> Proc:
    """A Tandem gateway over ``{"both": w}`` (aggregated) or ``{"prefill", "decode"}``."""
    # Patient health checks: on two cores busy-waiting vLLM engines can keep a worker's
    # servicer from answering a 2 s probe for a minute (CI saw both workers ejected while a
    # NIXL fetch stalled), and these tests are about answers, not about ejecting workers.
    args = ["gateway", "--host", HOST, "--port", "0", "--log-level", "info", *extra]
    args += ["--health-check-interval-secs", "30", "--health-check-timeout-secs", "20"]
    args += ["--health-failure-threshold", "3"]
    if "both" in workers:
        args += ["--worker-urls", f"grpc://{workers['both'].address}"]
    else:
        args += ["--pd-disaggregation", "--prefill", f"grpc://{workers['prefill'].address}"]
        args += ["--decode", f"grpc://{workers['decode'].address}"]
    proc, ready = start(args)
    return wait_ready(proc, ready, timeout=120)


def stop_all(*workers: VllmWorker) -> None:
    for worker in workers:
        worker.stop()


def wait_all(*workers: VllmWorker) -> None:
    started = time.monotonic()
    try:
        for worker in workers:
            worker.wait_ready(max(1.0, START_TIMEOUT_S - (time.monotonic() - started)))
    except Exception:
        stop_all(*workers)
        raise
