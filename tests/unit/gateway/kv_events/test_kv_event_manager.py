"""The manager keeps one subscription per healthy registered worker: an unhealthy or
removed worker's entries go within a watch round, a worker healthy again comes back from
its snapshot, and a protocol without the RPC gets no subscription at all.

Workers are stand-ins (``kv_event_source.EventsWorker``: the worker's real publisher and
stream behind a bare vLLM-protocol servicer, on 127.0.0.1); the registry, clients and
manager are the gateway's own. The health flag is flipped by hand: the health checker's
own tests (tests/unit/gateway/workers) cover how it decides.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from kv_event_source import BLOCK, EventsWorker, WorkerCache, until

from tandem.gateway.backends.vllm.client import VllmClient
from tandem.gateway.kv_events.keys import request_keys
from tandem.gateway.kv_events.manager import KvEventManager
from tandem.gateway.workers.registry import WorkerRegistry

pytestmark = pytest.mark.timeout(20)

PROMPT = list(range(100, 116))


class NoEventsClient(VllmClient):
    """A protocol without SubscribeKvEvents, as MLX's client is."""

    kv_events_method = ""


@pytest.fixture
async def registry() -> AsyncIterator[WorkerRegistry]:
    reg = WorkerRegistry(connect_timeout_s=3.0, client_factory=VllmClient)
    try:
        yield reg
    finally:
        await asyncio.wait_for(reg.close(), 5)


async def serving(source: WorkerCache | None) -> EventsWorker:
    worker = EventsWorker(source.publisher if source else None)
    await worker.start()
    if source is not None:
        source.publisher.start(asyncio.get_running_loop())
    return worker


async def test_follows_health_and_membership(registry: WorkerRegistry) -> None:
    source = WorkerCache()
    source.prefill(PROMPT)
    worker = await serving(source)
    manager = KvEventManager(registry, watch_s=0.05, backoff_initial_s=0.05, backoff_max_s=0.2)
    keys = request_keys(PROMPT, (), BLOCK)

    def held() -> int:
        return manager.index.leading_blocks(keys, [worker.url])[worker.url]

    try:
        manager.start()
        registered = await registry.add(worker.url, "prefill")  # added after the start
        await until(lambda: manager.live(worker.url) and held() == 4)

        registered.healthy = False  # the health checker gave up on it
        await until(lambda: not manager.live(worker.url) and held() == 0, within_s=1.0)
        assert manager.subscription(worker.url) is None

        source.prefill([*PROMPT, 1, 2, 3, 4])  # it changed meanwhile
        registered.healthy = True  # back: subscribed again, rebuilt from its snapshot
        await until(lambda: manager.live(worker.url) and manager.index.blocks(worker.url) == 5)

        registry.remove(worker.url)  # gone at once, not at the next watch round
        assert manager.subscription(worker.url) is None and held() == 0
    finally:
        await manager.stop()
        await source.publisher.stop()
        await worker.stop()


async def test_workers_without_events_get_no_live_stream() -> None:
    silent = await serving(None)  # UNIMPLEMENTED
    plain = await serving(WorkerCache())
    registry = WorkerRegistry(
        connect_timeout_s=3.0,
        client_factory=lambda url: NoEventsClient(url) if url == plain.url else VllmClient(url),
    )
    manager = KvEventManager(registry, watch_s=0.05, no_events_retry_s=0.1)
    try:
        await registry.add(silent.url)
        await registry.add(plain.url)
        manager.start()
        sub = manager.subscription(silent.url)
        assert sub is not None
        await until(lambda: sub.state == "no_events")
        assert manager.subscription(plain.url) is None  # no RPC: never subscribed
        assert not manager.live(silent.url) and not manager.live(plain.url)
    finally:
        await manager.stop()
        await registry.close()
        await silent.stop()
        await plain.stop()
