"""The worker's KV-event publisher (issue 36, docs/worker-protocols.md "KV events"): what a
real ``PrefixCache`` reports through it, its sequence numbers, replays, snapshots, slow
subscribers and load heartbeats, and the wire form of its batches."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
import torch

from tandem.engine.block_keys import block_keys
from tandem.engine.kv_events import BlockSource, BlocksRemoved, BlocksStored, CacheCleared
from tandem.engine.prefix_cache import PrefixCache
from tandem.engine.types import MediaItem, ModelShape
from tandem.worker.kv_events.convert import apply_pb, block_hash, to_pb
from tandem.worker.kv_events.publisher import KvEventPublisher, LoadFigures, SubscriberTooSlow

SHAPE = ModelShape(num_layers=1, num_kv_heads=1, head_dim=2, vocab_size=1000, max_context=4096)
BLOCK = 4
LOAD = LoadFigures(
    running=2, waiting=1, waiting_uncached_tokens=None, token_usage=0.5, max_running=0
)


def cache_with(publisher: KvEventPublisher | None, capacity_blocks: int = 100) -> PrefixCache:
    cache = PrefixCache(SHAPE, capacity_blocks * BLOCK * SHAPE.kv_bytes_per_token, BLOCK)
    cache.set_listener(publisher)
    return cache


def prefill(cache: PrefixCache, ids: Sequence[int], media: Sequence[MediaItem] = ()) -> list[bytes]:
    keys = block_keys(ids, media, None, BLOCK)
    kv = [(torch.zeros(1, len(ids), 2), torch.zeros(1, len(ids), 2))]
    cache.insert(keys, kv, BlockSource(ids, media, None, BLOCK))
    return keys


def test_stores_evictions_and_clears_are_numbered_batches_with_parents_and_images() -> None:
    publisher = KvEventPublisher(lambda: LOAD)  # never started: applies at once
    cache = cache_with(publisher, capacity_blocks=3)
    image = MediaItem("ab" * 16, offset=2, length=4)
    first = prefill(cache, list(range(8)), [image])  # 2 blocks; the image spans both
    longer = prefill(cache, list(range(12)))  # the same 2 blocks + 1 new (other key: no image)
    history = list(publisher._history)
    assert [b.sequence for b in history] == [1, 2]
    (stored,) = history[0].events
    assert isinstance(stored, BlocksStored) and stored.parent is None
    assert [b.key for b in stored.blocks] == first
    assert [m.offset for b in stored.blocks for m in b.media] == [0, 2]  # where in the image
    assert [b.token_ids for b in stored.blocks] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    # The text-only prompt's keys differ from the image prompt's: all three blocks are new,
    # and the cache (3 blocks) evicts both of the image prompt's.
    kinds = [type(e) for e in history[1].events]
    assert kinds == [BlocksStored, BlocksRemoved]
    assert [b.key for b in history[1].events[0].blocks] == longer
    assert sorted(history[1].events[1].keys) == sorted(first)
    cache.clear()
    assert publisher.sequence == 3
    assert list(publisher._history)[-1].events == (CacheCleared(),)
    assert publisher.live_blocks == 0


def test_a_cache_without_listener_builds_no_event() -> None:
    cache = cache_with(None)
    prefill(cache, list(range(8)))
    assert cache.num_blocks == 2


def test_a_late_subscriber_gets_a_snapshot_ending_at_the_current_sequence() -> None:
    publisher = KvEventPublisher(lambda: LOAD, chunk_blocks=2)
    cache = cache_with(publisher)
    for base in (0, 100, 200):
        prefill(cache, [base + i for i in range(8)])  # three chains of two blocks
    _, first = publisher.subscribe(0, early_load=False)
    assert [b.sequence for b in first] == [1, 2, 3]  # ends at S = 3
    assert first[0].events[0] == CacheCleared()
    assert all(b.snapshot is not None and b.snapshot.count == 3 for b in first)
    state: dict[int, object] = {}
    for batch in first:
        apply_pb(state, to_pb(batch, LOAD, 1))
    assert len(state) == 6 == publisher.live_blocks


def test_a_subscriber_within_the_history_gets_a_replay_and_one_too_old_a_snapshot() -> None:
    publisher = KvEventPublisher(lambda: LOAD, history=2)
    cache = cache_with(publisher)
    for base in (0, 100, 200):
        prefill(cache, [base + i for i in range(4)])
    _, replay = publisher.subscribe(3, early_load=False)
    assert [b.sequence for b in replay] == [3] and replay[0].snapshot is None
    _, too_old = publisher.subscribe(1, early_load=False)  # batch 1 left the history
    assert too_old[0].snapshot is not None and too_old[0].events[0] == CacheCleared()


async def test_a_subscriber_that_falls_behind_is_ended() -> None:
    publisher = KvEventPublisher(lambda: LOAD, queue_limit=2)
    publisher.start(asyncio.get_running_loop())
    try:
        cache = cache_with(publisher)
        subscriber, _ = publisher.subscribe(0, early_load=False)
        for base in (0, 100, 200):
            prefill(cache, [base + i for i in range(4)])
        await asyncio.sleep(0.05)  # the batches reach the loop
        with pytest.raises(SubscriberTooSlow):
            await subscriber.next()
    finally:
        await publisher.stop()


async def test_load_heartbeats_reach_a_subscriber_that_asked_for_them() -> None:
    publisher = KvEventPublisher(lambda: LOAD, heartbeat_s=0.05)
    publisher.start(asyncio.get_running_loop())
    try:
        subscriber, _ = publisher.subscribe(0, early_load=True)
        beat = await asyncio.wait_for(subscriber.next(), 2)
        assert beat.load_only and beat.sequence == 0 and not beat.events
        wire = to_pb(beat, publisher.load(), 1)
        assert wire.load.load_only and wire.load.running_requests == 2
        assert wire.load.waiting_requests == 1 and wire.load.token_usage == 0.5
    finally:
        await publisher.stop()


def test_the_wire_hash_is_the_first_eight_key_bytes_little_endian_signed() -> None:
    key = bytes([0xFF] * 8) + bytes(24)
    assert block_hash(key) == -1
    assert block_hash(bytes([1]) + bytes(31)) == 1
    publisher = KvEventPublisher(lambda: LOAD)
    cache = cache_with(publisher)
    keys = prefill(cache, list(range(8)), [MediaItem("cd" * 16, offset=1, length=2)])
    wire = to_pb(next(iter(publisher._history)), LOAD, 1)
    stored = wire.events[0].stored
    assert [b.block_hash for b in stored.blocks] == [block_hash(k) for k in keys]
    assert not stored.HasField("parent_block_hash")
    (extra,) = stored.blocks[0].extra_keys
    assert (extra.multimodal.identifier, extra.multimodal.offset) == ("cd" * 16, 0)
    assert not stored.blocks[1].extra_keys
