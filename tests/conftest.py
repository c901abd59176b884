"""Session-wide fixtures: the built-in tiny models, generated once into a temp cache; the
stored-responses directory; a PostgreSQL server for the history tests (started on demand)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.integration.postgres_server import PostgresServer


@pytest.fixture(scope="session", autouse=True)
def history_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where test gateways keep stored responses (the default SQLite file), never in ~.

    Set for the whole session, as TANDEM_CACHE_DIR is below; child processes inherit it.
    """
    root = tmp_path_factory.mktemp("history")
    os.environ["TANDEM_HISTORY_DIR"] = str(root)
    return root


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A PostgreSQL server of the session's own (tests/integration/postgres_server.py).

    Fails, never skips, when PostgreSQL is not installed: ``make test`` installs it.
    """
    from tests.integration.postgres_server import PostgresMissing, start_postgres

    try:
        server = start_postgres()
    except PostgresMissing as exc:
        pytest.fail(str(exc))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def model_cache() -> Path:
    """A cache dir holding both built-in models; child processes inherit it via the env.

    The user's model cache (``make serve`` uses the same one) unless TANDEM_TEST_CACHE_DIR
    names another (``.ci/run`` gives an empty one). Generating a checkpoint copies the
    shipped weights (engine/builtin_shipped.py) and takes about a second; it never trains,
    so nothing slow runs inside the first test's timeout. Stale shipped weights fail every
    test that needs a model at once, with the command that retrains them.
    """
    from tandem.engine.builtin import default_cache_root, generate_builtin
    from tandem.engine.builtin_shipped import StaleWeightsError

    root = Path(os.environ.get("TANDEM_TEST_CACHE_DIR") or default_cache_root())
    os.environ["TANDEM_CACHE_DIR"] = str(root)
    for name in ("tiny-qwen3-vl", "tiny-llava-1.5"):
        try:
            generate_builtin(name, root)
        except StaleWeightsError as exc:
            pytest.fail(f"preparing the built-in model {name}: {exc}", pytrace=False)
    return root


@pytest.fixture(scope="session")
def qwen_dir(model_cache: Path) -> Path:
    from tandem.engine.builtin import resolve_model

    return resolve_model("tiny-qwen3-vl")


@pytest.fixture(scope="session")
def llava_dir(model_cache: Path) -> Path:
    from tandem.engine.builtin import resolve_model

    return resolve_model("tiny-llava-1.5")
