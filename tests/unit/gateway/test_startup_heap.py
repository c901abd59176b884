"""The gateway's startup heap is frozen out of the collector's full walks (server.py)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from tandem.gateway.server import freeze_startup_heap


@pytest.fixture
def unfrozen_after() -> Iterator[None]:
    yield
    gc.unfreeze()  # the rest of the test session walks its objects as before


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def test_live_objects_leave_the_generations_and_garbage_is_collected_first(
    unfrozen_after: None,
) -> None:
    alive = Node()
    alive.other = alive  # tracked by the collector (a cycle, still referenced)
    dead = Node()
    dead.other = dead
    gone = weakref.ref(dead)
    del dead  # garbage that only a collection frees

    frozen = freeze_startup_heap()

    assert frozen == gc.get_freeze_count() > 0
    assert gone() is None, "garbage was frozen instead of collected"
    assert all(obj is not alive for obj in gc.get_objects()), "a live object is still walked"
