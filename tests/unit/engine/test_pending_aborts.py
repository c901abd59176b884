"""Aborts that never meet their request are forgotten: the set stays bounded."""

from __future__ import annotations

from tandem.engine.aborts import PendingAborts


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_an_abort_that_arrives_first_still_meets_its_request() -> None:
    aborts = PendingAborts(memory_s=60, clock=Clock())
    aborts.add("r1")
    assert aborts.take("r1") is True
    assert aborts.take("r1") is False  # once


def test_aborts_for_unknown_requests_expire() -> None:
    clock = Clock()
    aborts = PendingAborts(memory_s=60, clock=clock)
    for i in range(1000):
        aborts.add(f"gone-{i}")
    clock.now = 61.0
    aborts.add("fresh")
    assert len(aborts) == 1
    assert aborts.take("gone-0") is False and aborts.take("fresh") is True


def test_aborts_are_capped_in_number() -> None:
    aborts = PendingAborts(memory_s=1e9, max_pending=100, clock=Clock())
    for i in range(10_000):
        aborts.add(f"r{i}")
    assert len(aborts) == 100
    assert aborts.take("r9999") is True and aborts.take("r0") is False


def test_take_any_finds_running_ids_only() -> None:
    aborts = PendingAborts(clock=Clock())
    aborts.add("a")
    aborts.add("b")
    assert aborts.take_any(["b", "c"]) == ["b"]
    assert aborts.take("a") is True and len(aborts) == 0
