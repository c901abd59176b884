"""One subscription over a real gRPC stream on 127.0.0.1: snapshot then live, a sequence gap
makes it resync from a snapshot, a lost worker's entries go at once and come back from its
snapshot, UNIMPLEMENTED leaves the worker to the fallback.

The server is a stand-in for a worker (``kv_event_source.EventsWorker``: the worker's real
publisher and stream code behind a bare servicer), or, for the gap, a scripted stream of
hand-built batches: a real worker never skips a number, so only a script can.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from kv_event_source import BLOCK, EventsWorker, WorkerCache, until
from smg_grpc_proto.generated import common_pb2 as common

from tandem.gateway.backends.vllm.client import VllmClient
from tandem.gateway.kv_events.index import KvEventIndex
from tandem.gateway.kv_events.keys import request_keys
from tandem.gateway.kv_events.subscription import KvEventSubscription

pytestmark = pytest.mark.timeout(20)

A = list(range(100, 116))
FAST = {"backoff_initial_s": 0.05, "backoff_max_s": 0.2, "no_events_retry_s": 0.2}


def held(index: KvEventIndex, url: str, prompt: list[int]) -> int:
    return index.leading_blocks(request_keys(prompt, (), BLOCK), [url])[url]


async def test_snapshot_then_live_then_worker_lost_and_back() -> None:
    source = WorkerCache()
    source.prefill(A[:8])  # cached before anyone subscribed: reaches us by snapshot
    worker = EventsWorker(source.publisher)
    await worker.start()
    source.publisher.start(asyncio.get_running_loop())
    client = VllmClient(worker.url)
    index = KvEventIndex()
    sub = KvEventSubscription(worker.url, client.subscribe_kv_events, index, **FAST)
    sub.start()
    try:
        await until(lambda: sub.live and held(index, worker.url, A) == 2)
        source.prefill(A)  # live: the two new blocks arrive as a stored event
        await until(lambda: held(index, worker.url, A) == 4)
        assert sub.resyncs == 0 and sub.cursor == source.publisher.sequence
        await until(lambda: sub.fresh_load() is not None)

        await worker.stop()  # the worker goes away: its entries go with the stream
        await until(lambda: not sub.live and index.blocks(worker.url) == 0)
        await worker.start()  # back on its port, cache intact: rebuilt from its snapshot
        await until(lambda: sub.live and held(index, worker.url, A) == 4)
        assert sub.connects >= 2
    finally:
        await sub.stop()
        await source.publisher.stop()
        await worker.stop()
        await client.close()
    assert index.blocks(worker.url) == 0  # a stopped subscription leaves nothing behind


def _stored(block_hash: int, tokens: list[int], parent: int | None = None) -> common.KvCacheEvent:
    stored = common.KvBlocksStored(
        blocks=[common.KvBlock(block_hash=block_hash, token_ids=tokens, block_size=len(tokens))]
    )
    if parent is not None:
        stored.parent_block_hash = parent
    return common.KvCacheEvent(stored=stored)


def _snapshot(seq: int, events: list[common.KvCacheEvent]) -> common.KvEventBatch:
    cleared = common.KvCacheEvent(cleared=common.KvCacheCleared())
    return common.KvEventBatch(
        sequence_number=seq,
        events=[cleared, *events],
        snapshot=common.KvSnapshotChunk(index=0, count=1, blocks=len(events)),
    )


class ScriptedStream:
    """A vLLM-protocol SubscribeKvEvents that plays one list of batches per connection."""

    def __init__(self, scripts: list[list[common.KvEventBatch]]) -> None:
        self.scripts = scripts
        self.requests: list[common.SubscribeKvEventsRequest] = []
        self.server = grpc.aio.server()
        handler = grpc.unary_stream_rpc_method_handler(
            self._play,
            request_deserializer=common.SubscribeKvEventsRequest.FromString,
            response_serializer=common.KvEventBatch.SerializeToString,
        )
        self.server.add_generic_rpc_handlers(
            [
                grpc.method_handlers_generic_handler(
                    "vllm.grpc.engine.VllmEngine", {"SubscribeKvEvents": handler}
                )
            ]
        )
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    async def _play(
        self, request: common.SubscribeKvEventsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[common.KvEventBatch]:
        self.requests.append(request)
        script = self.scripts[min(len(self.requests), len(self.scripts)) - 1]
        for batch in script:
            yield batch
        await asyncio.sleep(30)  # then silence: the stream stays open


async def test_sequence_gap_drops_the_worker_and_resyncs_by_snapshot() -> None:
    a, b, c = [1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]
    first = [
        _snapshot(0, []),
        common.KvEventBatch(sequence_number=1, events=[_stored(11, a)]),
        common.KvEventBatch(sequence_number=2, events=[_stored(12, b, parent=11)]),
        common.KvEventBatch(sequence_number=4, events=[_stored(13, c, parent=12)]),  # 3 lost
    ]
    # The resync: a snapshot at 4 holding what the worker has now (a, b, c).
    second = [_snapshot(4, [_stored(11, a), _stored(12, b, parent=11), _stored(13, c, parent=12)])]
    stream = ScriptedStream([first, second])
    await stream.server.start()
    url = f"127.0.0.1:{stream.port}"
    client = VllmClient(url)
    index = KvEventIndex()
    sub = KvEventSubscription(url, client.subscribe_kv_events, index, **FAST)
    sub.start()
    try:
        await until(lambda: sub.resyncs == 1 and sub.live and sub.cursor == 4)
        assert held(index, url, [*a, *b, *c]) == 3
        # Both connections asked from 0, i.e. for a snapshot, with early load records.
        assert [r.start_sequence_number for r in stream.requests] == [0, 0]
        assert all(r.load_records_before_first_batch for r in stream.requests)
    finally:
        await sub.stop()
        await client.close()
        await stream.server.stop(grace=None)


async def test_a_stream_without_snapshot_is_live_from_its_first_batch_per_rank() -> None:
    """smg's relay in front of vLLM streams live only, each rank numbered on its own."""
    a, b = [1, 2, 3, 4], [5, 6, 7, 8]
    late = [
        common.KvEventBatch(sequence_number=7, events=[_stored(11, a)]),
        common.KvEventBatch(sequence_number=3, dp_rank=1, events=[_stored(21, b)]),
        common.KvEventBatch(sequence_number=8, events=[_stored(12, b, parent=11)]),
        common.KvEventBatch(sequence_number=4, dp_rank=1),
    ]
    gap = [common.KvEventBatch(sequence_number=6, dp_rank=1)]  # rank 1 skipped 5
    stream = ScriptedStream([[*late, *gap], late])
    await stream.server.start()
    url = f"127.0.0.1:{stream.port}"
    client = VllmClient(url)
    index = KvEventIndex()
    sub = KvEventSubscription(url, client.subscribe_kv_events, index, **FAST)
    sub.start()
    try:
        # The first stream's rank-1 gap drops the worker; the second ends at rank 0's 8.
        await until(lambda: sub.resyncs == 1 and sub.live and sub.cursors == {0: 8, 1: 4})
        assert held(index, url, [*a, *b]) == 2 and held(index, url, b) == 1
    finally:
        await sub.stop()
        await client.close()
        await stream.server.stop(grace=None)


async def test_worker_without_events_is_left_to_the_fallback() -> None:
    worker = EventsWorker(None)  # answers UNIMPLEMENTED, like --no-kv-events
    await worker.start()
    client = VllmClient(worker.url)
    index = KvEventIndex()
    sub = KvEventSubscription(worker.url, client.subscribe_kv_events, index, **FAST)
    sub.start()
    try:
        await until(lambda: sub.state == "no_events")
        await until(lambda: sub.connects >= 2)  # asked again later (an upgraded worker)
        assert not sub.live and sub.resyncs == 0 and not index.known(worker.url)
    finally:
        await sub.stop()
        await client.close()
        await worker.stop()
