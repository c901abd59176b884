"""Admission control: the bounded request queue and the in-flight pixel budget."""

from __future__ import annotations

import asyncio

import pytest

from tandem.errors import TandemError
from tandem.gateway import metrics
from tandem.gateway.admission import AdmissionQueue, PixelBudget
from tandem.gateway.config import GatewayConfig


def rejected_count(reason: str) -> float:
    return (
        metrics.REGISTRY.get_sample_value("tandem_admission_rejected_total", {"reason": reason})
        or 0.0
    )


async def test_queue_admits_up_to_the_limit_then_queues_then_refuses() -> None:
    queue = AdmissionQueue(max_concurrent=2, max_queued=1)
    a = await queue.acquire(5)
    b = await queue.acquire(5)
    waiting = asyncio.ensure_future(queue.acquire(5))
    await asyncio.sleep(0)
    assert not waiting.done() and queue.queued == 1 and queue.running == 2
    before = rejected_count("queue_full")
    with pytest.raises(TandemError) as info:
        await queue.acquire(5)
    err = info.value
    assert (err.status, err.code, err.retry_after) == (429, "too_many_requests", 1)
    assert rejected_count("queue_full") == before + 1
    a.release()
    c = await asyncio.wait_for(waiting, 1)
    assert queue.running == 2 and queue.queued == 0
    for slot in (b, c):
        slot.release()
    assert queue.running == 0


async def test_waiters_are_served_in_arrival_order() -> None:
    queue = AdmissionQueue(max_concurrent=1, max_queued=3)
    first = await queue.acquire(5)
    order: list[int] = []

    async def wait(i: int) -> None:
        slot = await queue.acquire(5)
        order.append(i)
        slot.release()

    tasks = [asyncio.ensure_future(wait(i)) for i in range(3)]
    await asyncio.sleep(0)
    first.release()
    await asyncio.wait_for(asyncio.gather(*tasks), 1)
    assert order == [0, 1, 2] and queue.running == 0


async def test_release_is_idempotent() -> None:
    queue = AdmissionQueue(max_concurrent=1, max_queued=0)
    slot = await queue.acquire(5)
    slot.release()
    slot.release()
    assert queue.running == 0
    again = await queue.acquire(5)
    assert queue.running == 1
    again.release()


async def test_a_waiter_that_times_out_leaves_the_line_with_504() -> None:
    queue = AdmissionQueue(max_concurrent=1, max_queued=1)
    held = await queue.acquire(5)
    with pytest.raises(TandemError) as info:
        await queue.acquire(0.05)
    assert (info.value.status, info.value.code) == (504, "request_timeout")
    assert queue.queued == 0
    held.release()
    assert queue.running == 0


async def test_a_cancelled_waiter_does_not_take_a_slot() -> None:
    queue = AdmissionQueue(max_concurrent=1, max_queued=2)
    held = await queue.acquire(5)
    gone = asyncio.ensure_future(queue.acquire(5))
    await asyncio.sleep(0)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert queue.queued == 0
    held.release()
    assert queue.running == 0
    (await queue.acquire(5)).release()


async def test_a_slot_handed_to_a_waiter_that_gave_up_is_passed_on() -> None:
    queue = AdmissionQueue(max_concurrent=1, max_queued=2)
    held = await queue.acquire(5)
    loser = asyncio.ensure_future(queue.acquire(5))
    winner = asyncio.ensure_future(queue.acquire(5))
    await asyncio.sleep(0)
    held.release()  # hands the slot to ``loser`` ...
    loser.cancel()  # ... which is cancelled before it runs again
    with pytest.raises(asyncio.CancelledError):
        await loser
    slot = await asyncio.wait_for(winner, 1)
    assert queue.running == 1
    slot.release()
    assert queue.running == 0


async def test_zero_concurrency_means_no_limit() -> None:
    queue = AdmissionQueue(max_concurrent=0, max_queued=0)
    slots = [await queue.acquire(5) for _ in range(1000)]
    assert queue.running == 1000
    for slot in slots:
        slot.release()


def test_negative_bounds_are_refused() -> None:
    with pytest.raises(ValueError):
        AdmissionQueue(-1, 0)
    with pytest.raises(ValueError):
        PixelBudget(-1)


def test_pixel_budget_holds_refuses_and_gives_back() -> None:
    budget = PixelBudget(1000)
    a = budget.acquire(600)
    assert budget.used == 600
    assert metrics.REGISTRY.get_sample_value("tandem_mm_inflight_bytes") == 600
    before = rejected_count("mm_inflight_bytes")
    with pytest.raises(TandemError) as info:
        budget.acquire(500)
    err = info.value
    assert (err.status, err.code, err.retry_after) == (429, "multimodal_inflight_budget", 1)
    assert rejected_count("mm_inflight_bytes") == before + 1
    b = budget.acquire(400)  # exactly full is allowed
    a.release()
    a.release()  # idempotent
    assert budget.used == 400
    b.release()
    assert budget.used == 0


def test_a_request_above_the_whole_budget_is_413_even_when_idle() -> None:
    budget = PixelBudget(1000)
    with pytest.raises(TandemError) as info:
        budget.acquire(1001)
    assert (info.value.status, info.value.code) == (413, "multimodal_payload_too_large")
    assert info.value.retry_after is None  # waiting cannot help
    assert budget.used == 0


def test_zero_budget_means_no_limit() -> None:
    budget = PixelBudget(0)
    lease = budget.acquire(1 << 40)
    lease.release()
    assert budget.used == 0


def test_gateway_flags_reach_the_config() -> None:
    from tandem.cli import build_parser
    from tandem.gateway.cli import config_from_args

    args = build_parser().parse_args(
        [
            "gateway",
            "--worker-urls",
            "127.0.0.1:1",
            "--multimodal-max-inflight-bytes",
            "0",
            "--max-concurrent-requests",
            "3",
            "--max-queued-requests",
            "4",
            "--drain-timeout-secs",
            "5",
            "--health-check-timeout-secs",
            "7.5",
            "--health-failure-threshold",
            "4",
            "--mm-workers-nice",
            "3",
        ]
    )
    config = config_from_args(args)
    assert (config.health_timeout_s, config.health_failure_threshold) == (7.5, 4)
    assert (config.mm_max_inflight_bytes, config.max_concurrent_requests) == (0, 3)
    assert (config.max_queued_requests, config.drain_timeout_s) == (4, 5.0)
    assert config.mm_workers_nice == 3
    defaults = config_from_args(build_parser().parse_args(["gateway"]))
    assert defaults.mm_max_inflight_bytes == 512 << 20
    assert (defaults.max_concurrent_requests, defaults.max_queued_requests) == (256, 512)
    assert (defaults.health_timeout_s, defaults.health_failure_threshold) == (2.0, 2)
    assert defaults.mm_workers_nice == 10
    for nice in (-1, 20):
        with pytest.raises(ValueError, match="--mm-workers-nice"):
            GatewayConfig(mm_workers_nice=nice)
    with pytest.raises(ValueError):
        GatewayConfig(max_queued_requests=-1)
    with pytest.raises(ValueError):
        GatewayConfig(health_failure_threshold=0)


async def test_health_flags_reach_the_running_checker() -> None:
    from tandem.gateway.state import GatewayState

    state = GatewayState(GatewayConfig(health_timeout_s=9.0, health_failure_threshold=3))
    await state.start()
    try:
        assert state.health is not None and state.health.running
        assert (state.health.timeout_s, state.health.unhealthy_after) == (9.0, 3)
    finally:
        await state.stop()


def test_event_loop_choice() -> None:
    from tandem.cli import build_parser
    from tandem.gateway.cli import use_uvloop

    assert build_parser().parse_args(["gateway"]).event_loop == "auto"
    assert use_uvloop("asyncio") is False
    assert use_uvloop("auto") is True  # uvloop is a dependency on Linux
    assert use_uvloop("uvloop") is True
