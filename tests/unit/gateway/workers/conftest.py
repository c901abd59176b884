"""Fixtures for the gateway worker tests: a fake engine worker on loopback and a client."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from workers_fake_engine import FakeEngineWorker, make_client

from tandem.gateway.backends.vllm.client import VllmClient


@pytest.fixture
async def fake_worker() -> AsyncIterator[FakeEngineWorker]:
    worker = FakeEngineWorker()
    await worker.start()
    try:
        yield worker
    finally:
        await worker.stop()


@pytest.fixture
async def client(fake_worker: FakeEngineWorker) -> AsyncIterator[VllmClient]:
    c = make_client(fake_worker.url)
    try:
        yield c
    finally:
        await c.close()
