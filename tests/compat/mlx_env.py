"""Build (once) the virtualenv that runs the real MLX servicer on CPU for the compatibility lane.

The venv lives outside the repository (``~/.cache/tandem/mlx/venv``, or
``$TANDEM_MLX_HOME/venv``), as the vLLM one does (``vllm_env``): a rerun starts at once, a
fresh machine pays the install once (≈ 1 min, ≈ 355 MB). It is never a dependency of Tandem.

What is pinned, and why:

* ``mlx[cpu]`` brings mlx's Linux CPU wheel (``mlx-cpu``); no Metal, no torch, no CUDA.
* ``mlx-lm==0.31.3``: a plain ``mlx-lm`` install resolves to 0.32.x, which servicer 0.14.1
  cannot import (its ``[mlx]`` extra only says ``<0.32``).
* ``smg-grpc-servicer[mlx]==0.14.1`` is the servicer smg ships; it serves
  ``mlx.grpc.engine.MlxEngine`` from the same ``smg-grpc-proto`` Tandem pins.
* Every other distribution is held at the version a working install resolved to
  (``CONSTRAINTS``), so a later install on another machine runs the same code — transformers
  (the tokenizer the servicer bundles and mlx-lm loads), tokenizers, numpy, protobuf and grpc
  especially.

After the install the venv is checked for torch and any ``nvidia-*``/CUDA distribution: one
of them means a pin drifted, and the build fails rather than quietly fetching gigabytes.

Run ``python -m tests.compat.vllm_env`` (``make test-vllm`` does): it builds this venv too,
so no one-time install runs inside a test's timeout.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

MLX_VERSION = "0.32.4"
PACKAGES = (
    f"mlx[cpu]=={MLX_VERSION}",
    "mlx-lm==0.31.3",
    "smg-grpc-servicer[mlx]==0.14.1",
)
# The rest of the resolved set (pip list of a working install), as pip constraints: they pin
# a version without asking for a package nothing needs.
CONSTRAINTS = (
    f"mlx-cpu=={MLX_VERSION}",
    "smg-grpc-proto==0.4.28",
    "transformers==5.12.1",
    "tokenizers==0.22.2",
    "huggingface_hub==1.33.0",
    "hf-xet==1.8.0",
    "safetensors==0.8.0",
    "sentencepiece==0.2.3",
    "numpy==2.4.6",
    "protobuf==7.36.2",
    "grpcio==1.85.3",
    "grpcio-health-checking==1.85.1",
    "grpcio-reflection==1.85.1",
    "jinja2==3.1.6",
    "markupsafe==3.0.4",
    "pyyaml==6.0.4",
    "regex==2026.11.19",
    "tqdm==4.70.1",
    "filelock==4.3.2",
    "fsspec==2026.9.0",
    "packaging==26.4",
    "httpx==0.29.0",
    "httpcore==1.0.9",
    "h11==0.16.0",
    "anyio==4.16.0",
    "idna==3.20",
    "certifi==2026.10.19.post1",
    "typer==0.29.2",
    "click==8.5.1",
    "rich==15.0.0",
    "pygments==2.21.0",
    "markdown-it-py==4.3.0",
    "mdurl==0.1.2",
    "shellingham==1.5.4",
    "annotated-doc==0.0.7",
    "pydantic==2.14.4",
    "pydantic-core==2.50.5",
    "annotated-types==0.8.0",
    "typing-extensions==4.16.0",
    "typing-inspection==0.4.5",
)
FORBIDDEN_PREFIXES = ("torch", "nvidia-", "cuda-", "triton")
HOME = Path(os.environ.get("TANDEM_MLX_HOME", Path.home() / ".cache/tandem/mlx"))
VENV = HOME / "venv"
STAMP = VENV / ".tandem-ready"
STAMP_TEXT = " ".join((*PACKAGES, *CONSTRAINTS)) + " | no-torch v1\n"


def mlx_python() -> Path:
    return VENV / "bin" / "python"


def ensure_mlx_venv() -> Path:
    """The python of a ready MLX venv, building or repairing the venv first."""
    if STAMP.exists() and STAMP.read_text() == STAMP_TEXT and mlx_python().exists():
        return mlx_python()
    started = time.monotonic()
    HOME.mkdir(parents=True, exist_ok=True)
    if not mlx_python().exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    constraints = HOME / "constraints.txt"
    constraints.write_text("\n".join(CONSTRAINTS) + "\n")
    pip = [str(mlx_python()), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, *PACKAGES, "-c", str(constraints)], check=True, timeout=1200)
    _refuse_torch_and_cuda()
    check = [str(mlx_python()), "-c", _IMPORT_CHECK]
    versions = subprocess.run(check, capture_output=True, text=True, timeout=300, check=True)
    STAMP.write_text(STAMP_TEXT)
    took = time.monotonic() - started
    print(f"MLX venv ready in {took:.0f}s: {versions.stdout.strip()}", file=sys.stderr)
    return mlx_python()


# What the lane runs: the servicer's server module imports mlx, mlx-lm and the proto stubs.
_IMPORT_CHECK = (
    "import importlib.metadata as m, smg_grpc_servicer.mlx.server; "
    "print(*(f'{d} {m.version(d)}' for d in ('mlx', 'mlx-lm', 'smg-grpc-servicer')))"
)


def _refuse_torch_and_cuda() -> None:
    listed = subprocess.run(
        [str(mlx_python()), "-m", "pip", "list", "--format=freeze", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.lower()
    names = [line.split("==")[0] for line in listed.splitlines() if line]
    bad = [name for name in names if name.startswith(FORBIDDEN_PREFIXES)]
    if bad:
        raise RuntimeError(f"the MLX venv at {VENV} pulled {bad}: a pin in mlx_env drifted")


if __name__ == "__main__":
    print(ensure_mlx_venv())
