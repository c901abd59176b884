"""The event index follows a worker's stored / removed / cleared events and its snapshot,
fed with the batches a real prefix cache and publisher produce (``kv_event_source.py``)."""

from __future__ import annotations

from kv_event_source import BLOCK, WorkerCache
from smg_grpc_proto.generated import common_pb2 as common

from tandem.gateway.kv_events.index import KvEventIndex
from tandem.gateway.kv_events.keys import request_keys

A = list(range(100, 116))  # 4 blocks
B = list(range(200, 212))  # 3 blocks


def _feed(index: KvEventIndex, url: str, batches: list[common.KvEventBatch]) -> None:
    for batch in batches:
        index.apply(url, batch.events)


def _held(index: KvEventIndex, url: str, prompt: list[int]) -> int:
    return index.leading_blocks(request_keys(prompt, (), BLOCK), [url])[url]


def test_stored_extends_a_chain_across_batches() -> None:
    worker, index = WorkerCache(), KvEventIndex()
    worker.prefill(A[:8])
    worker.prefill(A)  # only blocks 2 and 3 are new: a stored event with a parent
    batches = worker.new_batches()
    assert len(batches) == 2 and batches[1].events[0].stored.HasField("parent_block_hash")
    _feed(index, "w", batches)
    assert _held(index, "w", A) == 4 and index.blocks("w") == 4


def test_removed_blocks_shorten_the_match() -> None:
    worker, index = WorkerCache(capacity_blocks=5), KvEventIndex()
    worker.prefill(A)
    worker.prefill(B)  # 7 blocks into 5: A's two least recent blocks are evicted
    batches = worker.new_batches()
    kinds = [e.WhichOneof("data") for b in batches for e in b.events]
    assert "removed" in kinds
    _feed(index, "w", batches)
    assert index.blocks("w") == 5
    assert _held(index, "w", B) == 3
    assert _held(index, "w", A) < 4  # never more than the worker still holds


def test_cleared_empties_only_that_worker() -> None:
    one, two, index = WorkerCache(), WorkerCache(), KvEventIndex()
    one.prefill(A)
    two.prefill(A)
    _feed(index, "one", one.new_batches())
    _feed(index, "two", two.new_batches())
    keys = request_keys(A, (), BLOCK)
    assert index.leading_blocks(keys, ["one", "two"]) == {"one": 4, "two": 4}
    one.cache.clear()
    result = index.apply("one", one.new_batches()[0].events)
    assert result.cleared
    assert index.leading_blocks(keys, ["one", "two"]) == {"one": 0, "two": 4}
    assert index.known("one") and index.blocks("one") == 0


def test_snapshot_rebuilds_what_the_live_stream_built() -> None:
    worker = WorkerCache(capacity_blocks=6)
    worker.prefill(A)
    worker.prefill(B)
    worker.prefill(A[:8])
    live = KvEventIndex()
    _feed(live, "w", worker.new_batches())
    rebuilt = KvEventIndex()
    rebuilt.apply("w", [common.KvCacheEvent(stored=common.KvBlocksStored())])  # stale junk
    _feed(rebuilt, "w", worker.snapshot())  # chunk 0 begins with a clear
    for prompt in (A, B, A[:8]):
        assert _held(rebuilt, "w", prompt) == _held(live, "w", prompt)
    assert rebuilt.blocks("w") == live.blocks("w") == worker.publisher.live_blocks


def test_unknown_parent_is_dropped_not_guessed() -> None:
    worker, index = WorkerCache(), KvEventIndex()
    worker.prefill(A[:8])
    worker.new_batches()  # the gateway never saw these
    worker.prefill(A)
    result = index.apply("w", worker.new_batches()[0].events)
    assert result.dropped == 2 and result.stored == 0
    assert index.blocks("w") == 0


def test_cap_drops_oldest_and_drop_worker_forgets_everything() -> None:
    worker, index = WorkerCache(), KvEventIndex(max_blocks=3)
    worker.prefill(A)
    _feed(index, "w", worker.new_batches())
    assert index.blocks("w") == 3
    assert _held(index, "w", A) == 0  # block 0 went first: the walk stops at once
    index.drop_worker("w")
    assert not index.known("w") and index.holders(request_keys(A, (), BLOCK)[1]) == frozenset()
