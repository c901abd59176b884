"""HealthChecker against a real grpc.aio server on 127.0.0.1 that stops and comes back on
the same port (a protocol-level test double, see workers_fake_engine.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from workers_fake_engine import FakeEngineWorker, make_client

from tandem.gateway.workers.breaker import CircuitBreaker
from tandem.gateway.workers.health import HealthChecker
from tandem.gateway.workers.registry import WorkerRegistry
from tandem.gateway.workers.worker import EngineLoad, Worker

pytestmark = pytest.mark.timeout(10)


@pytest.fixture
async def registry() -> AsyncIterator[WorkerRegistry]:
    reg = WorkerRegistry(
        # Every worker added here is up: the deadline only has to survive a loaded CI
        # machine (0.5 s once failed a fresh-clone `make test` at registration).
        connect_timeout_s=3.0,
        client_factory=make_client,
        breaker_factory=lambda: CircuitBreaker(failure_threshold=2, cooldown_s=0.0),
    )
    try:
        yield reg
    finally:
        await asyncio.wait_for(reg.close(), 5)


async def eventually_healthy(
    checker: HealthChecker, worker: Worker, want: bool, within_s: float = 4.0
) -> None:
    """Run check rounds until ``worker.healthy == want``; fail after ``within_s``."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        await checker.check_once()
        if worker.healthy == want:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{worker.url} never became healthy={want}")


async def test_unhealthy_answer_and_recovery(
    registry: WorkerRegistry, fake_worker: FakeEngineWorker
) -> None:
    worker = await registry.add(fake_worker.url)
    checker = HealthChecker(registry, interval_s=1.0, timeout_s=0.5, unhealthy_after=1)
    assert await checker.check_once() == {worker.url: True}
    fake_worker.state.healthy = False
    assert await checker.check_once() == {worker.url: False}
    assert not worker.healthy and not worker.available
    assert worker.breaker.consecutive_failures == 1
    fake_worker.state.healthy = True
    assert await checker.check_once() == {worker.url: True}
    assert worker.available and worker.breaker.consecutive_failures == 0


async def test_a_healthy_worker_reports_its_engine_queue_for_the_policies(
    registry: WorkerRegistry, fake_worker: FakeEngineWorker
) -> None:
    worker = await registry.add(fake_worker.url)
    checker = HealthChecker(registry, interval_s=1.0, timeout_s=0.5, unhealthy_after=1)
    assert worker.engine_load is None and worker.load == 0
    await checker.check_once()
    assert worker.engine_load == EngineLoad(running=2, waiting=1)  # the fake's GetLoads
    assert worker.load == 3  # the engine's queue: more than this gateway has in flight
    worker.in_flight = 5
    assert worker.load == 5
    fake_worker.state.healthy = False
    await checker.check_once()
    assert worker.engine_load is None  # a failed check leaves no stale figure behind


async def test_one_failed_check_is_not_an_outage(
    registry: WorkerRegistry, fake_worker: FakeEngineWorker
) -> None:
    worker = await registry.add(fake_worker.url)
    checker = HealthChecker(registry, interval_s=1.0, timeout_s=0.5, unhealthy_after=2)
    fake_worker.state.healthy = False
    assert await checker.check_once() == {worker.url: False}
    assert worker.healthy  # one failure: still in the pool
    assert await checker.check_once() == {worker.url: False}
    assert not worker.healthy  # two in a row: out
    fake_worker.state.healthy = True
    assert await checker.check_once() == {worker.url: True}
    assert worker.healthy  # the first good answer brings it back


async def test_server_stops_and_comes_back_on_same_port(
    registry: WorkerRegistry, fake_worker: FakeEngineWorker
) -> None:
    worker = await registry.add(fake_worker.url)
    checker = HealthChecker(registry, interval_s=1.0, timeout_s=0.5)
    port = fake_worker.port
    await fake_worker.stop()
    await eventually_healthy(checker, worker, want=False)
    await eventually_healthy(checker, worker, want=False)  # a second failure opens it
    assert worker.breaker.state != "closed"
    await fake_worker.start()
    assert fake_worker.port == port
    await eventually_healthy(checker, worker, want=True)
    assert worker.breaker.state == "closed" and worker.available


async def test_a_worker_back_on_its_port_serves_before_the_breaker_cooldown(
    fake_worker: FakeEngineWorker,
) -> None:
    """Issue 38: with an hour-long cooldown, the breaker the outage opened is closed by the
    first good health check once the worker is back, so it is routed to again at once."""
    reg = WorkerRegistry(
        connect_timeout_s=3.0,
        client_factory=make_client,
        breaker_factory=lambda: CircuitBreaker(failure_threshold=2, cooldown_s=3600.0),
    )
    try:
        worker = await reg.add(fake_worker.url)
        checker = HealthChecker(reg, interval_s=1.0, timeout_s=0.5, unhealthy_after=1)
        await fake_worker.stop()
        await eventually_healthy(checker, worker, want=False)
        await checker.check_once()  # the second failure in a row opens the breaker
        assert worker.breaker.state == "open" and not worker.available
        await fake_worker.start()
        await eventually_healthy(checker, worker, want=True)
        assert worker.breaker.state == "closed" and worker.available
        assert reg.available() == [worker]
    finally:
        await asyncio.wait_for(reg.close(), 5)


async def test_a_breaker_opened_by_requests_is_not_closed_by_passing_checks(
    fake_worker: FakeEngineWorker,
) -> None:
    """A worker that answers its health checks while its requests fail keeps the breaker's
    cooldown: only a check after failed checks (the worker was down) counts as a probe."""
    reg = WorkerRegistry(
        connect_timeout_s=3.0,
        client_factory=make_client,
        breaker_factory=lambda: CircuitBreaker(failure_threshold=2, cooldown_s=3600.0),
    )
    try:
        worker = await reg.add(fake_worker.url)
        checker = HealthChecker(reg, interval_s=1.0, timeout_s=0.5)
        worker.breaker.record_failure()
        worker.breaker.record_failure()  # two failed requests open it
        assert await checker.check_once() == {worker.url: True}
        assert worker.breaker.state == "open" and not worker.available
    finally:
        await asyncio.wait_for(reg.close(), 5)


async def test_background_loop_marks_worker_and_stops(
    registry: WorkerRegistry, fake_worker: FakeEngineWorker
) -> None:
    worker = await registry.add(fake_worker.url)
    checker = HealthChecker(registry, interval_s=0.02, timeout_s=0.5)
    checker.start()
    checker.start()  # idempotent
    try:
        fake_worker.state.healthy = False
        deadline = time.monotonic() + 3.0
        while worker.healthy and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert not worker.healthy
        assert checker.running
    finally:
        await asyncio.wait_for(checker.stop(), 3)
    assert not checker.running


async def test_removed_worker_is_left_alone(
    registry: WorkerRegistry, fake_worker: FakeEngineWorker
) -> None:
    worker = await registry.add(fake_worker.url)
    registry.remove(worker.url)
    checker = HealthChecker(registry, interval_s=1.0, timeout_s=0.5)
    assert await checker.check_once() == {}
