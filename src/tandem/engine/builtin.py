"""Built-in tiny models: checkpoint directories written on first use and cached on disk.

A built-in name resolves to an ordinary Hugging Face checkpoint directory under
``$TANDEM_CACHE_DIR`` (default ``~/.cache/tandem/models``) named
``<name>-<content key>-<weights digest>``; a changed generator or re-shipped weights change
the name, so stale directories are never reused. The config, tokenizer, template and
processor files are written by code; the weights are the trained ones shipped in the
package (engine/builtin_shipped.py), copied in, so first use takes a second and every
machine serves the same weights. Training happens only when asked for
(:func:`train_checkpoint`, ``tandem models train``). Generation writes into a temporary
directory beside the target and renames it into place, so readers never see a partial
checkpoint; processes that generate the same checkpoint at once take a lock file.

No torch is needed to resolve or generate a checkpoint; only training imports it.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Literal

from tandem.engine.builtin_shipped import StaleWeightsError, copy_shipped_weights, shipped_weights
from tandem.engine.builtin_specs import BUILTIN_SPECS, BuiltinSpec
from tandem.engine.builtin_tokenizer import write_tokenizer_files

BUILTIN_MODELS: tuple[str, ...] = tuple(BUILTIN_SPECS)
MARKER_FILE = "tandem-builtin.json"
# Where a generated checkpoint's weights come from: none, the package, or training.
WeightSource = Literal["none", "shipped", "train"]


class UnknownModelError(ValueError):
    """Neither a built-in model name nor a checkpoint directory."""


def is_builtin(name: str) -> bool:
    return name in BUILTIN_SPECS


def default_cache_root() -> Path:
    env = os.environ.get("TANDEM_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "tandem" / "models"


def builtin_dir(name: str, cache_root: Path, weights: bool = True) -> Path:
    """Where ``name``'s checkpoint lives in ``cache_root``; with weights, the name carries
    the shipped weights' digest (a :class:`StaleWeightsError` when they do not fit)."""
    spec = _spec(name)
    suffix = f"-{shipped_weights(spec).sha256[:8]}" if weights else "-noweights"
    return Path(cache_root) / f"{spec.name}-{spec.content_key()}{suffix}"


def generate_builtin(name: str, cache_root: Path | None = None, weights: bool = True) -> Path:
    """Return the directory of a built-in model, generating it first if missing.

    With ``weights=False`` the checkpoint lacks model.safetensors; all other files are
    byte-identical to the full one. Raises :class:`StaleWeightsError` (naming the command
    that fixes it) when the shipped weights were trained on another recipe.
    """
    spec = _spec(name)
    root = Path(cache_root) if cache_root is not None else default_cache_root()
    target = builtin_dir(name, root, weights)
    if (target / MARKER_FILE).exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{target.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed, even on a crash
        if not (target / MARKER_FILE).exists():  # another process may have made it meanwhile
            _generate(spec, root, target, "shipped" if weights else "none")
    return target


def train_checkpoint(name: str, out: Path) -> Path:
    """Train ``name`` from its seed on its recipe into a new checkpoint directory ``out``
    (minutes, with a progress bar; needs torch). ``ship_weights`` makes it the shipped one."""
    spec = _spec(name)
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not empty")
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists():
        out.rmdir()
    _generate(spec, out.parent, out, "train")
    return out


def _generate(spec: BuiltinSpec, root: Path, target: Path, weights: WeightSource) -> None:
    name = spec.name
    print(f"tandem: generating built-in model {name} in {target} ...", file=sys.stderr, flush=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=root))
    try:
        _write_checkpoint(tmp, spec, weights)
        try:
            os.rename(tmp, target)
        except OSError:
            # Another process finished first; its directory is identical to ours.
            if not (target / MARKER_FILE).exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def resolve_model(
    name_or_path: str | Path, weights: bool = True, cache_root: Path | None = None
) -> Path:
    """A built-in name → its cached checkpoint (generated if missing); else a local directory.

    ``weights=False`` is for callers that only need tokenizer/template/processor
    files: an existing full checkpoint is preferred, else a weightless one is made.
    """
    name = str(name_or_path)
    if is_builtin(name):
        root = Path(cache_root) if cache_root is not None else default_cache_root()
        if not weights:
            full = _existing_full_dir(name, root)
            if full is not None:
                return full
        return generate_builtin(name, root, weights)
    path = Path(name).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return path.resolve()
    raise UnknownModelError(
        f"model {name!r} is neither a built-in model ({', '.join(BUILTIN_MODELS)}) "
        "nor a directory holding a Hugging Face checkpoint (config.json)"
    )


def _existing_full_dir(name: str, root: Path) -> Path | None:
    try:
        full = builtin_dir(name, root)
    except StaleWeightsError:
        return None  # weightless files need no weights: stale ones do not matter here
    return full if (full / MARKER_FILE).exists() else None


def _spec(name: str) -> BuiltinSpec:
    try:
        return BUILTIN_SPECS[name]
    except KeyError:
        raise UnknownModelError(
            f"unknown built-in model {name!r}; choose one of {', '.join(BUILTIN_MODELS)}"
        ) from None


def _write_checkpoint(directory: Path, spec: BuiltinSpec, weights: WeightSource) -> None:
    _write_config(directory, spec)
    # Tokenizer and processor files first: training renders its examples with them.
    write_tokenizer_files(directory, spec)
    _write_json(directory / "preprocessor_config.json", spec.preprocessor_config)
    if spec.processor_config is not None:
        _write_json(directory / "processor_config.json", spec.processor_config)
    if spec.video_preprocessor_config is not None:
        _write_json(directory / "video_preprocessor_config.json", spec.video_preprocessor_config)
    if weights == "shipped":
        copy_shipped_weights(directory, spec)
    elif weights == "train":
        # Imported here so that everything but training stays torch-free.
        try:
            from tandem.engine.builtin_weights import write_weights
        except ImportError as exc:
            raise RuntimeError(
                f"training the weights of {spec.name} needs torch (the 'engine' extra)"
            ) from exc
        write_weights(directory, spec)
    marker = {"name": spec.name, "key": spec.content_key(), "weights": weights}
    # The marker goes last: its presence means the directory is complete.
    _write_json(directory / MARKER_FILE, marker)
    # mkdtemp made the directory private; a model cache is meant to be shared.
    directory.chmod(0o755)
    for path in directory.iterdir():
        path.chmod(0o644)


def _write_config(directory: Path, spec: BuiltinSpec) -> None:
    from transformers import AutoConfig, GenerationConfig

    fields = dict(spec.config)
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    config.save_pretrained(directory)
    GenerationConfig(**spec.generation_config).save_pretrained(directory)
    # transformers stamps its own version into both files: a checkpoint written under
    # another release would differ in bytes only there. Left out, the same recipe gives the
    # same files whichever transformers wrote them.
    for name in ("config.json", "generation_config.json"):
        path = directory / name
        data = json.loads(path.read_text(encoding="utf-8"))
        data.pop("transformers_version", None)
        _write_json(path, data)


def _write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
