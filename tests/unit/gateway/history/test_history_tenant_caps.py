"""Each tenant's own cap (``HistoryLimits.max_tenant_bytes``), on every backend, and the
memory backend holding its caps at every put rather than at the next sweep.

One tenant storing large responses must push out only its own oldest ones: another tenant
within its cap keeps every row, so its ``previous_response_id`` chains stay whole.
"""

from __future__ import annotations

import random

import pytest
from history_fakes import T0, Clock, MakeStore, turn

from tandem.gateway.history.memory import MemoryStore
from tandem.gateway.history.store import (
    HistoryLimits,
    ResponseStore,
    ResponseTooLarge,
    StoredResponse,
)

SIZE = turn("r0").size()  # every turn("rN") below has this size (ids of equal length)


def limits(total_rows: int, tenant_rows: int) -> HistoryLimits:
    """Caps counted in rows of SIZE bytes."""
    return HistoryLimits(
        max_total_bytes=total_rows * SIZE,
        max_tenant_bytes=tenant_rows * SIZE,
        max_response_bytes=SIZE,
    )


async def kept(store: ResponseStore, items: list[StoredResponse]) -> list[str]:
    return [i.id for i in items if await store.get(i.tenant, i.id) is not None]


async def test_a_tenant_over_its_cap_loses_its_own_oldest_never_anothers(
    make_store: MakeStore,
) -> None:
    store = await make_store(limits(total_rows=4, tenant_rows=2))
    # b's one response is the oldest row of all: without per-tenant caps it went first.
    b1 = turn("r0", tenant="b", created_at=T0)
    a = [turn(f"r{i}", f"r{i - 1}" if i > 1 else None, "a", T0 + i) for i in range(1, 5)]
    await store.put(b1)
    for item in a:
        await store.put(item)
    await store.sweep()  # the SQL backends evict here; the memory one did at each put
    assert await kept(store, [b1, *a]) == ["r0", "r3", "r4"]
    chain = await store.chain("b", "r0")
    assert chain is not None and [t.id for t in chain] == ["r0"]
    assert await store.sweep() == 0


async def test_the_total_cap_still_holds_when_the_tenant_caps_add_up_to_more(
    make_store: MakeStore,
) -> None:
    store = await make_store(limits(total_rows=3, tenant_rows=2))
    rows = [turn(f"r{i}", tenant="a" if i < 3 else "b", created_at=T0 + i) for i in range(1, 5)]
    for item in rows:
        await store.put(item)
    await store.sweep()
    # Both tenants are within their caps, the four rows are not within the total: the
    # oldest of anyone's goes.
    assert await kept(store, rows) == ["r2", "r3", "r4"]


async def test_a_response_over_its_tenants_cap_is_refused_and_not_stored(
    make_store: MakeStore,
) -> None:
    small = turn("r1", tenant="a")
    cap = small.size() + 10
    # Limits built directly (the flags refuse a response cap over the tenant cap).
    store = await make_store(HistoryLimits(max_response_bytes=10 * cap, max_tenant_bytes=cap))
    await store.put(small)
    big = turn("r2", tenant="a", text="x" * 200)
    with pytest.raises(ResponseTooLarge) as caught:
        await store.put(big)
    assert (caught.value.size, caught.value.limit) == (big.size(), cap)
    assert await store.get("a", "r2") is None
    assert await store.get("a", "r1") == small


def stored_bytes(store: MemoryStore, tenant: str | None = None) -> int:
    rows = store._rows.values()
    return sum(row.size for row in rows if tenant is None or row.tenant == tenant)


async def test_memory_put_keeps_the_store_within_its_caps_without_a_sweep() -> None:
    """Never started, so no sweeper runs: each put alone keeps RAM within the caps."""
    shuffle = random.Random(7)
    tenants = ["heavy"] * 6 + ["t1", "t2", "t3"]
    items = [
        # Sizes vary, and ages run out of order (a replayed or clock-skewed write).
        turn(
            f"r{i:04d}",
            tenant=shuffle.choice(tenants),
            created_at=T0 + shuffle.uniform(0, 1000),
            text="x" * shuffle.randrange(1, 300),
        )
        for i in range(400)
    ]
    largest = max(item.size() for item in items)
    cap, tenant_cap = 20 * largest, 8 * largest
    caps = HistoryLimits(
        max_total_bytes=cap, max_tenant_bytes=tenant_cap, max_response_bytes=largest
    )
    store = MemoryStore(caps, clock=Clock())
    for item in items:
        await store.put(item)
        assert stored_bytes(store) <= cap
        for name in set(tenants):
            assert stored_bytes(store, name) <= tenant_cap
        assert await store.get(item.tenant, item.id) == item  # the row just put stays
    assert stored_bytes(store, "heavy") > tenant_cap - largest  # kept close to its cap


async def test_memory_put_evicts_the_tenants_oldest_rows_first() -> None:
    store = MemoryStore(limits(total_rows=6, tenant_rows=3), clock=Clock())
    other = turn("r0", tenant="b", created_at=T0)  # the oldest row of all
    await store.put(other)
    for i in range(1, 4):
        await store.put(turn(f"r{i}", tenant="a", created_at=T0 + 10 + i))
    assert stored_bytes(store, "a") == 3 * SIZE
    # An older row than a's others (written late): it is the one a client was just told is
    # stored, so a's oldest other row goes instead, and b's row is not a's to give up.
    late = turn("r4", tenant="a", created_at=T0 + 1)
    await store.put(late)
    assert sorted(key[1] for key in store._rows if key[0] == "a") == ["r2", "r3", "r4"]
    assert await store.get("b", "r0") == other
    # Replacing a row counts its new size, not both.
    await store.put(turn("r4", tenant="a", created_at=T0 + 1))
    assert stored_bytes(store, "a") == 3 * SIZE and stored_bytes(store) == 4 * SIZE
    assert await store.sweep() == 0
    assert await store.delete("a", "r3") is True
    await store.put(turn("r5", tenant="a", created_at=T0 + 20))
    assert sorted(key[1] for key in store._rows if key[0] == "a") == ["r2", "r4", "r5"]
