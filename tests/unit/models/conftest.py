"""Weightless built-in checkpoints (tokenizer, template, processor files) for the session."""

from __future__ import annotations

from pathlib import Path

import pytest

from tandem.engine.builtin import generate_builtin


@pytest.fixture(scope="session")
def meta_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tandem-meta-models")
    return {
        name: generate_builtin(name, root, weights=False)
        for name in ("tiny-qwen3-vl", "tiny-llava-1.5")
    }


@pytest.fixture(scope="session")
def qwen_meta_dir(meta_dirs: dict[str, Path]) -> Path:
    return meta_dirs["tiny-qwen3-vl"]


@pytest.fixture(scope="session")
def llava_meta_dir(meta_dirs: dict[str, Path]) -> Path:
    return meta_dirs["tiny-llava-1.5"]
