"""The built-in models' shipped weights: they fit the code's recipes, generation copies them
(no torch, no training), and a stale or damaged copy is refused with the command that fixes it."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from tandem.cli import main
from tandem.engine import builtin_shipped
from tandem.engine.builtin import BUILTIN_MODELS, MARKER_FILE, generate_builtin
from tandem.engine.builtin_shipped import (
    SHIPPED_DIR,
    StaleWeightsError,
    file_sha256,
    shipped_weights,
)
from tandem.engine.builtin_specs import BUILTIN_SPECS


@pytest.mark.parametrize("name", BUILTIN_MODELS)
def test_shipped_weights_fit_the_recipe(name: str) -> None:
    """Fails when a recipe (or anything else in the content key) changed without retraining;
    the message names the command to run."""
    try:
        weights = shipped_weights(BUILTIN_SPECS[name])
    except StaleWeightsError as exc:
        pytest.fail(str(exc))
    assert file_sha256(weights.path) == weights.sha256
    assert weights.path.parent == SHIPPED_DIR


def _changed_recipe(monkeypatch: pytest.MonkeyPatch, name: str = "tiny-qwen3-vl") -> None:
    spec = BUILTIN_SPECS[name]
    assert spec.training is not None
    longer = replace(spec, training=replace(spec.training, steps=spec.training.steps + 1))
    monkeypatch.setitem(BUILTIN_SPECS, name, longer)


def test_changed_recipe_is_refused_naming_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _changed_recipe(monkeypatch)
    with pytest.raises(StaleWeightsError, match=r"`tandem models train tiny-qwen3-vl --ship`"):
        generate_builtin("tiny-qwen3-vl", tmp_path)
    assert not list(tmp_path.iterdir())  # refused before anything was written
    # Files that need no weights are still made: the gateway can serve the tokenizer.
    assert (generate_builtin("tiny-qwen3-vl", tmp_path, weights=False) / MARKER_FILE).exists()


def test_models_check_reports_fit_and_stale(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["models", "check"]) == 0
    assert capsys.readouterr().out.count("shipped weights fit recipe") == len(BUILTIN_MODELS)
    _changed_recipe(monkeypatch)
    assert main(["models", "check"]) == 1
    out = capsys.readouterr().out
    assert "tiny-qwen3-vl: the shipped weights of tiny-qwen3-vl were trained on recipe" in out
    assert "tiny-llava-1.5: shipped weights fit recipe" in out


def _fake_shipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the shipped folder that a test may change, in place of the real one."""
    folder = tmp_path / "shipped"
    shutil.copytree(SHIPPED_DIR, folder)
    monkeypatch.setattr(builtin_shipped, "SHIPPED_DIR", folder)
    return folder


def test_damaged_weights_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _fake_shipped(tmp_path, monkeypatch)
    weights = folder / "tiny-llava-1.5.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(StaleWeightsError, match="does not match the SHA-256"):
        generate_builtin("tiny-llava-1.5", tmp_path / "cache")
    assert [p.name for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".lock")] == []


def test_missing_record_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _fake_shipped(tmp_path, monkeypatch)
    (folder / "tiny-llava-1.5.json").unlink()
    with pytest.raises(StaleWeightsError, match=r"is missing\): run `tandem models train"):
        generate_builtin("tiny-llava-1.5", tmp_path / "cache")


@pytest.mark.weights  # trains (2 steps)
def test_train_ship_then_generate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """`tandem models train NAME --ship --out DIR` (a 2-step recipe): the checkpoint is
    written, the shipped record names the new recipe, and generation then copies those
    weights into a cache directory named after them."""
    folder = _fake_shipped(tmp_path, monkeypatch)
    spec = BUILTIN_SPECS["tiny-llava-1.5"]
    assert spec.training is not None
    short = replace(spec, training=replace(spec.training, steps=2))
    monkeypatch.setitem(BUILTIN_SPECS, spec.name, short)
    out = tmp_path / "trained"
    assert main(["models", "train", spec.name, "--out", str(out), "--ship"]) == 0
    err = capfd.readouterr().err
    assert "tandem: training tiny-llava-1.5" in err and "2/2" in err
    assert "shipped weights written to" in err
    record = json.loads((folder / "tiny-llava-1.5.json").read_text())
    assert record["key"] == short.content_key() != spec.content_key()
    assert record["sha256"] == file_sha256(out / "model.safetensors")
    generated = generate_builtin(spec.name, tmp_path / "cache")
    assert file_sha256(generated / "model.safetensors") == record["sha256"]
    assert generated.name == f"{spec.name}-{short.content_key()}-{record['sha256'][:8]}"
    # The untouched model's record is the real one still.
    assert json.loads((folder / "tiny-qwen3-vl.json").read_text()) == json.loads(
        (SHIPPED_DIR / "tiny-qwen3-vl.json").read_text()
    )


def test_train_needs_a_destination(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "train", "tiny-llava-1.5"]) == 2
    assert "give --out DIR, --ship, or both" in capsys.readouterr().err
    (tmp_path / "file").write_text("x")
    assert main(["models", "train", "tiny-llava-1.5", "--out", str(tmp_path)]) == 2
    assert "is not empty" in capsys.readouterr().err
