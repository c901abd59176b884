"""Fixtures for the dispatch tests: the built-in model's handle, no retry backoff."""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_worker_client import MODEL

from tandem.gateway.dispatch import retry
from tandem.gateway.model import ModelHandle


@pytest.fixture(scope="session")
def model(qwen_meta_dir: Path) -> ModelHandle:
    return ModelHandle.from_dir(qwen_meta_dir, MODEL)


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """A retry goes out at once: the jittered backoff would only slow the tests down."""

    async def immediately(attempt: int) -> None:
        return None

    monkeypatch.setattr(retry, "backoff", immediately)
