"""Session-wide fixtures: the built-in tiny models, generated once into a temp cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache dir holding both built-in models; child processes inherit it via the env."""
    root = Path(os.environ.get("TANDEM_TEST_CACHE_DIR") or tmp_path_factory.mktemp("models"))
    os.environ["TANDEM_CACHE_DIR"] = str(root)
    from tandem.engine.builtin import generate_builtin

    for name in ("tiny-qwen3-vl", "tiny-llava-1.5"):
        generate_builtin(name, root)
    return root


@pytest.fixture(scope="session")
def qwen_dir(model_cache: Path) -> Path:
    from tandem.engine.builtin import resolve_model

    return resolve_model("tiny-qwen3-vl")


@pytest.fixture(scope="session")
def llava_dir(model_cache: Path) -> Path:
    from tandem.engine.builtin import resolve_model

    return resolve_model("tiny-llava-1.5")
