"""CircuitBreaker state machine, driven by a fake clock (a settable float, no sleeping)."""

from __future__ import annotations

import pytest

from tandem.gateway.workers.breaker import CircuitBreaker


class FakeClock:
    """A fake clock: time moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def tripped(clock: FakeClock, threshold: int = 3) -> CircuitBreaker:
    breaker = CircuitBreaker(failure_threshold=threshold, cooldown_s=10.0, clock=clock)
    for _ in range(threshold):
        breaker.record_failure()
    return breaker


def test_opens_after_threshold_consecutive_failures(clock: FakeClock) -> None:
    breaker = CircuitBreaker(failure_threshold=3, cooldown_s=10.0, clock=clock)
    breaker.record_failure()
    breaker.record_failure()
    assert breaker.state == "closed" and breaker.allow()
    breaker.record_failure()
    assert breaker.state == "open"
    assert not breaker.allow() and not breaker.can_attempt()


def test_success_resets_the_consecutive_count(clock: FakeClock) -> None:
    breaker = CircuitBreaker(failure_threshold=3, cooldown_s=10.0, clock=clock)
    for _ in range(5):
        breaker.record_failure()
        breaker.record_failure()
        breaker.record_success()
    assert breaker.state == "closed"


def test_half_open_after_cooldown_allows_exactly_one_probe(clock: FakeClock) -> None:
    breaker = tripped(clock)
    clock.now += 9.9
    assert breaker.state == "open"
    clock.now += 0.1
    assert breaker.state == "half_open"
    assert breaker.can_attempt()  # peeking does not take the probe
    assert breaker.allow()
    assert not breaker.allow() and not breaker.can_attempt()


def test_probe_success_closes(clock: FakeClock) -> None:
    breaker = tripped(clock)
    clock.now += 10
    assert breaker.allow()
    breaker.record_success()
    assert breaker.state == "closed"
    assert breaker.allow() and breaker.allow()
    assert breaker.consecutive_failures == 0


def test_probe_failure_reopens_for_a_full_cooldown(clock: FakeClock) -> None:
    breaker = tripped(clock)
    clock.now += 10
    assert breaker.allow()
    breaker.record_failure()
    assert breaker.state == "open"
    clock.now += 9.9
    assert breaker.state == "open"
    clock.now += 0.1
    assert breaker.state == "half_open"


def test_success_while_open_is_ignored(clock: FakeClock) -> None:
    breaker = tripped(clock)
    breaker.record_success()  # a straggler from before the breaker opened
    assert breaker.state == "open"


def test_a_call_begun_after_the_opening_closes_it_on_success(clock: FakeClock) -> None:
    """A health check that started once the breaker was open is a probe (issue 38): its
    success closes the breaker at once instead of after the cooldown."""
    breaker = tripped(clock)
    before = breaker.now() - 0.5  # began before the breaker opened: a straggler
    breaker.record_success(before)
    assert breaker.state == "open"
    clock.now += 1.0  # well within the 10 s cooldown
    began = breaker.now()
    clock.now += 0.1
    breaker.record_success(began)
    assert breaker.state == "closed" and breaker.allow()


def test_lost_probe_is_released_after_another_cooldown(clock: FakeClock) -> None:
    breaker = tripped(clock)
    clock.now += 10
    assert breaker.allow()  # the probe's outcome is never recorded
    clock.now += 9
    assert not breaker.allow()
    clock.now += 1
    assert breaker.allow()


@pytest.mark.parametrize(("threshold", "cooldown"), [(0, 1.0), (1, -1.0)])
def test_invalid_settings(threshold: int, cooldown: float) -> None:
    with pytest.raises(ValueError):
        CircuitBreaker(failure_threshold=threshold, cooldown_s=cooldown)
