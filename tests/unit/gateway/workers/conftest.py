"""Fixtures for the gateway worker tests: a fake engine worker on loopback and a client
(one of each Generate stream client)."""

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


# Every client test runs on both Generate stream clients (--worker-stream-client).
@pytest.fixture(params=["h2", "grpcio"])
async def client(
    fake_worker: FakeEngineWorker, request: pytest.FixtureRequest
) -> AsyncIterator[VllmClient]:
    c = make_client(fake_worker.url, h2_streams=request.param == "h2")
    try:
        yield c
    finally:
        await c.close()
