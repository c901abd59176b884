"""Unit-test fixtures and the markers ``make test-unit`` leaves out.

The weightless built-in checkpoints (tokenizer, template, processor files) are what gateway
and model-file tests need, made in a moment and without torch. A test that asks for the
trained models or a PostgreSQL server is marked here, from its fixtures: ``weights`` or
``processes``; ``fuzz`` (many generated cases) and ``processes`` are also set by hand in
the modules that need them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tandem.engine.builtin import generate_builtin

# Fixtures whose tests load the trained models (tests/conftest.py, tests/unit/engine).
_WEIGHT_FIXTURES = {"model_cache", "qwen_dir", "llava_dir", "builtin_cache", "builtin_dirs"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if fixtures & _WEIGHT_FIXTURES:
            item.add_marker(pytest.mark.weights)
        params = getattr(getattr(item, "callspec", None), "params", {})
        on_postgres = any(isinstance(v, str) and v == "postgres" for v in params.values())
        if "postgres_server" in fixtures or on_postgres:
            item.add_marker(pytest.mark.processes)


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
