"""The trained weights of the built-in models, shipped inside the package (no torch here).

Training a built-in model takes minutes and its float sums depend on the machine, so the
weights are trained once, by ``tandem models train NAME --ship``, and shipped as package
data: ``shipped/<name>.safetensors`` beside ``shipped/<name>.json``, which records the
recipe's content key (engine/builtin_specs.py) and the file's SHA-256. Generating a
built-in checkpoint copies them; it never trains. When the recipe in the code no longer
matches the shipped record, generation refuses with the command that fixes it, and so
does a fast test (tests/unit/engine/test_builtin_shipped.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from tandem.engine.builtin_specs import BuiltinSpec

SHIPPED_DIR = Path(__file__).with_name("shipped")
WEIGHTS_FILE = "model.safetensors"


class StaleWeightsError(RuntimeError):
    """The shipped weights were not trained on the recipe the code now states."""


@dataclass(frozen=True)
class ShippedWeights:
    name: str
    key: str  # the content key of the recipe that trained them
    sha256: str
    path: Path


def retrain_hint(name: str) -> str:
    return (
        f"run `tandem models train {name} --ship` (minutes on 2 cores) and commit "
        "src/tandem/engine/shipped/"
    )


def shipped_weights(spec: BuiltinSpec, shipped_dir: Path | None = None) -> ShippedWeights:
    """The shipped record of ``spec``'s weights; refuses when missing or stale."""
    folder = shipped_dir or SHIPPED_DIR
    record_path = folder / f"{spec.name}.json"
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StaleWeightsError(
            f"no shipped weights for {spec.name} ({record_path} is missing): "
            f"{retrain_hint(spec.name)}"
        ) from None
    weights = ShippedWeights(
        spec.name, str(record["key"]), str(record["sha256"]), folder / f"{spec.name}.safetensors"
    )
    if weights.key != spec.content_key():
        raise StaleWeightsError(
            f"the shipped weights of {spec.name} were trained on recipe {weights.key}, but the "
            f"code's recipe is {spec.content_key()}: {retrain_hint(spec.name)}"
        )
    return weights


def copy_shipped_weights(directory: Path, spec: BuiltinSpec) -> None:
    """Put the shipped weights into a checkpoint being generated, checking their digest."""
    weights = shipped_weights(spec)
    target = directory / WEIGHTS_FILE
    shutil.copyfile(weights.path, target)
    if file_sha256(target) != weights.sha256:
        raise StaleWeightsError(
            f"{weights.path} does not match the SHA-256 its record states (a damaged "
            f"install?): reinstall Tandem, or {retrain_hint(spec.name)}"
        )


def ship_weights(checkpoint: Path, spec: BuiltinSpec, shipped_dir: Path | None = None) -> Path:
    """Record a freshly trained checkpoint's weights as the shipped ones for ``spec``."""
    folder = shipped_dir or SHIPPED_DIR
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{spec.name}.safetensors"
    tmp = target.with_suffix(".tmp")
    shutil.copyfile(checkpoint / WEIGHTS_FILE, tmp)
    os.replace(tmp, target)
    record = {"name": spec.name, "key": spec.content_key(), "sha256": file_sha256(target)}
    text = json.dumps(record, indent=2) + "\n"
    (folder / f"{spec.name}.json").write_text(text, encoding="utf-8")
    return target


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
