"""WorkerRegistry against real grpc.aio servers on 127.0.0.1 (protocol-level test doubles,
see workers_fake_engine.py; the real embedded worker is tested elsewhere)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from workers_fake_engine import FakeEngineWorker, free_port, make_client

from tandem.gateway.workers.policies import CacheAwarePolicy, SelectionInput
from tandem.gateway.workers.registry import WorkerRegistry, WorkerUnreachableError
from tandem.gateway.workers.worker import Worker

pytestmark = pytest.mark.timeout(10)


@pytest.fixture
async def registry() -> AsyncIterator[WorkerRegistry]:
    reg = WorkerRegistry(connect_timeout_s=0.5, removal_grace_s=0.1, client_factory=make_client)
    try:
        yield reg
    finally:
        await asyncio.wait_for(reg.close(), 5)


async def test_add_discovers_labels_and_model(
    registry: WorkerRegistry, fake_worker: FakeEngineWorker
) -> None:
    worker = await registry.add(fake_worker.url, "decode")
    assert worker.url == fake_worker.url and worker.role == "decode"
    assert worker.model_id == "tiny-qwen3-vl"  # basename of model_path, no served name
    assert worker.healthy and worker.available
    assert worker.labels["supports_vision"] == "false"
    assert worker.language_model_only and not worker.supports_vision
    assert worker.accepts_media_refs
    assert worker.media_ref_schemes == {"http", "https", "data"}
    assert worker.kv_connector == "TandemConnector"
    assert "active_requests" not in worker.labels  # runtime state, not a capability
    assert registry.get(fake_worker.url) is worker
    assert registry.client(fake_worker.url).url == fake_worker.url
    assert registry.models() == ["tiny-qwen3-vl"]


async def test_served_model_name_wins(
    registry: WorkerRegistry, fake_worker: FakeEngineWorker
) -> None:
    fake_worker.state.model_info.served_model_name = "qwen-small"
    worker = await registry.add(f"grpc://{fake_worker.url}/")
    assert worker.model_id == "qwen-small"
    assert worker.url == fake_worker.url  # the scheme and slash are normalised away
    assert fake_worker.url in registry
    # Its client is found by its own url (the fast path) and by any other spelling.
    client = registry.client(worker.url)
    assert registry.client(f"grpc://{fake_worker.url}/") is client
    with pytest.raises(KeyError, match="no registered worker"):
        registry.client(f"127.0.0.1:{free_port()}")


async def test_unreachable_worker_raises_clear_error(registry: WorkerRegistry) -> None:
    url = f"127.0.0.1:{free_port()}"
    with pytest.raises(WorkerUnreachableError, match=url) as info:
        await asyncio.wait_for(registry.add(url), 5)
    assert info.value.url == url
    assert registry.get(url) is None and len(registry) == 0


async def test_duplicate_and_bad_role_are_refused(
    registry: WorkerRegistry, fake_worker: FakeEngineWorker
) -> None:
    with pytest.raises(ValueError, match="role"):
        await registry.add(fake_worker.url, "both")  # type: ignore[arg-type]
    await registry.add(fake_worker.url)
    with pytest.raises(ValueError, match="already registered"):
        await registry.add(fake_worker.url)


async def test_remove_filters_and_change_callbacks(registry: WorkerRegistry) -> None:
    events: list[tuple[str, str]] = []
    registry.on_change(lambda event, w: events.append((event, w.url)))
    fakes = [FakeEngineWorker() for _ in range(3)]
    for fake in fakes:
        await fake.start()
    try:
        fakes[2].state.model_info.served_model_name = "other"
        p = await registry.add(fakes[0].url, "prefill")
        d = await registry.add(fakes[1].url, "decode")
        o = await registry.add(fakes[2].url, "decode")
        assert registry.workers() == [p, d, o]
        assert registry.workers(role="decode") == [d, o]
        assert registry.workers(role="decode", model_id="tiny-qwen3-vl") == [d]
        assert registry.models() == ["other", "tiny-qwen3-vl"]
        d.healthy = False
        assert registry.available("decode", "tiny-qwen3-vl") == []
        assert registry.available() == [p, o]

        assert registry.remove(d.url) is True
        assert registry.remove(d.url) is False
        assert registry.get(d.url) is None
        with pytest.raises(KeyError):
            registry.client(d.url)
        assert events == [
            ("added", p.url),
            ("added", d.url),
            ("added", o.url),
            ("removed", d.url),
        ]
    finally:
        for fake in fakes:
            await fake.stop()


async def test_policy_state_dropped_when_worker_removed(
    registry: WorkerRegistry, fake_worker: FakeEngineWorker
) -> None:
    policy = CacheAwarePolicy()
    registry.on_change(lambda event, w: policy.remove_worker(w.url) if event == "removed" else None)
    worker = await registry.add(fake_worker.url)
    request = SelectionInput(token_ids=[1, 2, 3])
    assert policy.select(registry.available(), request) is worker
    assert policy.tree_size(worker.url) == 1  # three tokens: one (short) block
    registry.remove(worker.url)
    assert policy.tree_size(worker.url) == 0


async def test_failing_callback_does_not_break_registration(
    registry: WorkerRegistry, fake_worker: FakeEngineWorker
) -> None:
    seen: list[Worker] = []

    def broken(event: str, worker: Worker) -> None:
        raise RuntimeError("listener bug")

    registry.on_change(broken)
    registry.on_change(lambda event, w: seen.append(w))
    worker = await registry.add(fake_worker.url)
    assert seen == [worker]
