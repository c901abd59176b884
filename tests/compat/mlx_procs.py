"""A real MLX servicer (``smg_grpc_servicer.mlx.server``, mlx-lm on CPU) on 127.0.0.1.

The servicer runs from its own venv (``mlx_env``), in its own session so that teardown
stops it whatever it spawned. Its log is collected in the background (``Proc``, shown by
the compat conftest when a test fails). It is ready when it logs that it listens: it
flips its health to SERVING only after mlx-lm loaded the model and its generation thread
warmed up, and a ``HealthCheck`` over gRPC then confirms it answers.

Nothing is tuned: with the tiny built-in models a 2000-token answer takes ≈ 3 s of one
core, with or without a thread cap (``OMP_NUM_THREADS=1`` made no difference).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from bench.procs import free_port
from safetensors.numpy import load_file, save_file
from tests.integration.processes import LIVE, Proc

from tandem.wire.mlx import mpb, mpb_grpc

from .mlx_env import ensure_mlx_venv

HOST = "127.0.0.1"
READY_LINE = "gRPC server listening on"
START_TIMEOUT_S = 120.0  # ≈ 2 s when quiet; imports on a loaded 2-core machine take longer


@dataclass
class MlxServicer:
    """One ``python -m smg_grpc_servicer.mlx.server`` process and its collected log."""

    model_dir: Path
    proc: Proc
    port: int
    ready: threading.Event = field(default_factory=threading.Event)

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def url(self) -> str:
        return f"grpc://{self.address}"

    @property
    def model_id(self) -> str:
        """The id clients name: the servicer serves its model under the path it was given."""
        return str(self.model_dir)

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> MlxServicer:
        if not self.ready.wait(timeout) or self.proc.popen.poll() is not None:
            self.stop()
            raise RuntimeError(f"the MLX servicer did not start:\n{self.proc.output()[-6000:]}")
        reply = self._call("HealthCheck", mpb.HealthCheckRequest())
        if not reply.healthy:
            self.stop()
            raise RuntimeError(f"the MLX servicer is up but unhealthy: {reply.message}")
        return self

    def active_requests(self) -> int:
        """``GetServerInfo.active_requests``: Generate calls the servicer is still serving."""
        reply = self._call("GetServerInfo", mpb.GetServerInfoRequest())
        return int(reply.active_requests)

    def model_info(self) -> mpb.GetModelInfoResponse:
        return self._call("GetModelInfo", mpb.GetModelInfoRequest())

    def _call(self, method: str, request: Any) -> Any:
        # A channel per call: these are rare, and nothing lingers past a test.
        with grpc.insecure_channel(self.address) as channel:
            return getattr(mpb_grpc.MlxEngineStub(channel), method)(request, timeout=10)

    def stop(self) -> None:
        if self.proc.popen.poll() is None:
            try:
                os.killpg(self.proc.popen.pid, signal.SIGTERM)
                self.proc.popen.wait(15)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.popen.pid, signal.SIGKILL)
        if self.proc.popen.poll() is None:
            self.proc.popen.wait(60)  # reaping a killed torch heap can be slow on CI


def start_mlx(model_dir: Path) -> MlxServicer:
    """Start (not wait for) the real MLX servicer over ``model_dir``; ``wait_ready`` on it."""
    python = ensure_mlx_venv()
    port = free_port()
    argv = [str(python), "-m", "smg_grpc_servicer.mlx.server", "--model", str(model_dir)]
    argv += ["--host", HOST, "--port", str(port)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    popen = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    proc = Proc(["mlx-servicer", str(model_dir)], popen)
    LIVE.append(proc)
    servicer = MlxServicer(model_dir, proc, port)
    threading.Thread(target=_pump_until_ready, args=(servicer,), daemon=True).start()
    return servicer


def _pump_until_ready(servicer: MlxServicer) -> None:
    assert servicer.proc.popen.stdout is not None
    for raw in servicer.proc.popen.stdout:
        line = raw.rstrip("\n")
        servicer.proc.lines.append(line)
        if READY_LINE in line:
            servicer.ready.set()
    servicer.ready.set()  # it ended: wake the waiter, which sees the exit


def wait_until(check: Callable[[], Any], timeout: float, every: float = 0.05) -> bool:
    """Whether ``check()`` became truthy within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() >= deadline:
            return False
        time.sleep(every)
    return True


# Files of the VL checkpoint the text-only one shares unchanged: the servicer bundles them
# for GetTokenizer, and mlx-lm loads the tokenizer and the EOS ids from them.
_SHARED_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
)


def derive_text_qwen3(vl_dir: Path, target: Path) -> Path:
    """A plain Qwen3 checkpoint holding ``tiny-qwen3-vl``'s language model, for mlx-lm.

    mlx-lm 0.31.3 cannot load the VL checkpoint (its ``qwen3_vl`` loader wants the rope
    theta at the top of ``text_config`` and mlx-vlm's weight names), but the language model
    alone is a Qwen3: the config's text part (rope theta lifted out of ``rope_parameters``),
    the weights under ``model.language_model.`` moved to ``model.``, the LM head as is, the
    vision tower dropped. For text the result computes what the VL model computes: its
    M-RoPE gives every section the same position when there is no image, which is RoPE.
    """
    target.mkdir(parents=True, exist_ok=True)
    config = json.loads((vl_dir / "config.json").read_text())
    text = dict(config["text_config"])
    rope = text.pop("rope_parameters")
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"{vl_dir}: rope {rope['rope_type']!r} has no plain Qwen3 form")
    text.update(model_type="qwen3", architectures=["Qwen3ForCausalLM"])
    text["rope_theta"] = rope["rope_theta"]
    (target / "config.json").write_text(json.dumps(text, indent=2))
    prefix = "model.language_model."
    weights = {
        ("model." + name[len(prefix) :] if name.startswith(prefix) else name): value
        for name, value in load_file(str(vl_dir / "model.safetensors")).items()
        if name.startswith(prefix) or name == "lm_head.weight"
    }
    save_file(weights, str(target / "model.safetensors"), metadata={"format": "pt"})
    for name in _SHARED_FILES:
        shutil.copyfile(vl_dir / name, target / name)
    return target
