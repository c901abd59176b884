"""Generation of the built-in checkpoints: files, caching, atomicity, resolution."""

from __future__ import annotations

import hashlib
import os
import threading
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tandem.engine import builtin
from tandem.engine.builtin import (
    BUILTIN_MODELS,
    MARKER_FILE,
    UnknownModelError,
    builtin_dir,
    generate_builtin,
    resolve_model,
    train_checkpoint,
)
from tandem.engine.builtin_shipped import StaleWeightsError, shipped_weights
from tandem.engine.builtin_specs import BUILTIN_SPECS

EXPECTED_FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "preprocessor_config.json",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
    MARKER_FILE,
}


_WEIGHTS = "model.safetensors"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _entries(root: Path) -> list[str]:
    """What a cache holds, less the lock files that generation leaves (they stay, by design:
    removing one could let a second process lock a file a third no longer sees)."""
    return sorted(p.name for p in root.iterdir() if not p.name.endswith(".lock"))


def test_names_are_stable() -> None:
    assert BUILTIN_MODELS == ("tiny-qwen3-vl", "tiny-llava-1.5")


@pytest.mark.parametrize("name", BUILTIN_MODELS)
def test_checkpoint_files(name: str, builtin_dirs: dict[str, Path]) -> None:
    directory = builtin_dirs[name]
    assert {p.name for p in directory.iterdir()} >= EXPECTED_FILES
    assert directory.name.startswith(f"{name}-")
    assert BUILTIN_SPECS[name].content_key() in directory.name
    assert not [p for p in directory.parent.iterdir() if ".tmp-" in p.name]


def test_reuse_does_not_regenerate(
    builtin_dirs: dict[str, Path], builtin_cache: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    directory = builtin_dirs["tiny-llava-1.5"]
    stamp = (directory / "model.safetensors").stat().st_mtime_ns
    assert generate_builtin("tiny-llava-1.5", builtin_cache) == directory
    assert resolve_model("tiny-llava-1.5") == directory  # TANDEM_CACHE_DIR is the session cache
    assert (directory / "model.safetensors").stat().st_mtime_ns == stamp
    assert "generating" not in capfd.readouterr().err


def _short_training(monkeypatch: pytest.MonkeyPatch, steps: int = 3) -> None:
    """The real recipe cut to a few steps: the same code path in seconds, not minutes."""
    spec = BUILTIN_SPECS["tiny-qwen3-vl"]
    assert spec.training is not None
    short = replace(spec, training=replace(spec.training, steps=steps))
    monkeypatch.setitem(BUILTIN_SPECS, "tiny-qwen3-vl", short)


@pytest.mark.weights  # trains (3 steps)
def test_training_shows_progress_and_is_deterministic(
    builtin_dirs: dict[str, Path],
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _short_training(monkeypatch)
    threads = torch.get_num_threads()
    first = train_checkpoint("tiny-qwen3-vl", tmp_path / "a")
    err = capfd.readouterr().err
    assert err.startswith("tandem: generating built-in model tiny-qwen3-vl in ")
    assert "tandem: training tiny-qwen3-vl" in err and "3/3" in err  # the progress bar
    assert torch.get_num_threads() == threads  # training's fixed thread count is undone
    second = train_checkpoint("tiny-qwen3-vl", tmp_path / "b")
    for file in sorted(EXPECTED_FILES - {MARKER_FILE}):
        assert _digest(first / file) == _digest(second / file), file
    # Same files as the session's checkpoint but the weights, which saw 3 steps only.
    reference = builtin_dirs["tiny-qwen3-vl"]
    for file in sorted(EXPECTED_FILES - {MARKER_FILE, "model.safetensors"}):
        assert _digest(first / file) == _digest(reference / file), file
    assert _digest(first / "model.safetensors") != _digest(reference / "model.safetensors")
    with pytest.raises(FileExistsError):
        train_checkpoint("tiny-qwen3-vl", tmp_path / "a")


@pytest.mark.weights  # trains (1 step)
def test_training_changes_the_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _short_training(monkeypatch, steps=1)
    trained = load_file(str(train_checkpoint("tiny-qwen3-vl", tmp_path / "one") / _WEIGHTS))
    _short_training(monkeypatch, steps=0)
    initial = load_file(str(train_checkpoint("tiny-qwen3-vl", tmp_path / "zero") / _WEIGHTS))
    assert trained.keys() == initial.keys()
    changed = [k for k in trained if not torch.equal(trained[k], initial[k])]
    assert len(changed) > len(trained) // 2  # one AdamW step moves nearly every tensor


def test_generation_copies_the_shipped_weights(
    builtin_dirs: dict[str, Path], capfd: pytest.CaptureFixture[str]
) -> None:
    for name, directory in builtin_dirs.items():
        shipped = shipped_weights(BUILTIN_SPECS[name])
        assert _digest(directory / _WEIGHTS) == shipped.sha256
        assert directory.name.endswith(shipped.sha256[:8])  # re-shipped weights: a new dir
    assert "training" not in capfd.readouterr().err


def test_weightless_variant_is_torch_free_and_identical(
    builtin_dirs: dict[str, Path], tmp_path: Path
) -> None:
    light = generate_builtin("tiny-llava-1.5", tmp_path, weights=False)
    assert light == builtin_dir("tiny-llava-1.5", tmp_path, weights=False)
    assert not (light / "model.safetensors").exists()
    full = builtin_dirs["tiny-llava-1.5"]
    for file in sorted(EXPECTED_FILES - {"model.safetensors", MARKER_FILE}):
        assert _digest(light / file) == _digest(full / file), file
    # An existing full checkpoint is preferred over making a weightless one.
    assert resolve_model("tiny-llava-1.5", weights=False) == full


def test_changed_spec_gets_a_new_directory(
    builtin_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = builtin_dir("tiny-qwen3-vl", builtin_cache, weights=False)
    monkeypatch.setattr("tandem.engine.builtin_specs.GENERATOR_VERSION", 10**6)
    assert builtin_dir("tiny-qwen3-vl", builtin_cache, weights=False) != before
    # The shipped weights were trained by the old generator: no directory for them now.
    with pytest.raises(StaleWeightsError):
        builtin_dir("tiny-qwen3-vl", builtin_cache)


def test_failed_generation_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args: object) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr(builtin, "write_tokenizer_files", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        generate_builtin("tiny-llava-1.5", tmp_path, weights=False)
    assert _entries(tmp_path) == []


def test_concurrent_generation_yields_one_directory(tmp_path: Path) -> None:
    results: list[Path] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            results.append(generate_builtin("tiny-qwen3-vl", tmp_path, weights=False))
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(set(results)) == 1
    assert _entries(tmp_path) == [results[0].name]
    assert (results[0] / MARKER_FILE).exists()


def test_resolve_local_directory(builtin_dirs: dict[str, Path]) -> None:
    directory = builtin_dirs["tiny-qwen3-vl"]
    assert resolve_model(str(directory)) == directory.resolve()


def test_resolve_unknown(tmp_path: Path) -> None:
    with pytest.raises(UnknownModelError, match="neither a built-in"):
        resolve_model("no-such-model")
    with pytest.raises(UnknownModelError):
        resolve_model(str(tmp_path))  # a directory without config.json
    with pytest.raises(UnknownModelError, match="unknown built-in"):
        generate_builtin("tiny-gpt", tmp_path)


def test_default_cache_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TANDEM_CACHE_DIR", str(tmp_path))
    assert builtin.default_cache_root() == tmp_path
    monkeypatch.delenv("TANDEM_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert builtin.default_cache_root() == tmp_path / ".cache" / "tandem" / "models"


def test_cache_is_readable_by_others(builtin_dirs: dict[str, Path]) -> None:
    directory = builtin_dirs["tiny-qwen3-vl"]
    assert os.stat(directory).st_mode & 0o755 == 0o755
    assert os.stat(directory / "model.safetensors").st_mode & 0o644 == 0o644
