"""``SubscribeKvEvents`` and ``FlushCache`` for every protocol that has them.

:class:`KvEventRpcs` is a base of the vLLM, SGLang, TokenSpeed and TensorRT-LLM servicers
(TensorRT-LLM's service has no ``FlushCache``, so gRPC never calls that one there); the
messages are the shared ``smg.grpc.common`` ones. Each adapter hands its servicer the
process's one publisher and prefix cache (``worker/context.py``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any, Protocol

import grpc
from smg_grpc_proto.generated import common_pb2 as common

from tandem.engine.protocol import Engine
from tandem.worker.kv_events.convert import to_pb
from tandem.worker.kv_events.publisher import KvEventPublisher, SubscriberTooSlow


class ClearableCache(Protocol):
    """What FlushCache needs of the engine's prefix cache (``engine/prefix_cache.py``).

    A protocol, so that the servicers and the worker context never import the concrete
    cache (the process, ``worker/server.py``, builds it).
    """

    def clear(self) -> None: ...


NO_EVENTS = "Tandem workers publish no KV cache events when started with --no-kv-events"


async def subscribe(
    publisher: KvEventPublisher | None, request: Any, context: grpc.aio.ServicerContext
) -> AsyncIterator[common.KvEventBatch]:
    """The stream of one subscriber: a replay or a snapshot, then the live batches.

    Ends with RESOURCE_EXHAUSTED when the subscriber falls too far behind; however it ends
    (that, a cancel, a closed connection) the subscriber's queue is dropped.
    """
    if publisher is None:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, NO_EVENTS)
        return
    subscriber, first = publisher.subscribe(
        int(request.start_sequence_number), bool(request.load_records_before_first_batch)
    )
    sample = 0
    try:
        for batch in first:
            sample += 1
            yield to_pb(batch, publisher.load(), sample)
        while True:
            try:
                batch = await subscriber.next()
            except SubscriberTooSlow as exc:
                publisher.unsubscribe(subscriber)
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"KV events: {exc}")
                return
            sample += 1
            yield to_pb(batch, publisher.load(), sample)
    finally:
        publisher.unsubscribe(subscriber)


async def flush(
    cache: ClearableCache | None, engine: Engine, request: Any
) -> common.FlushCacheResponse:
    """Clear the prefix cache once the engine is idle, waiting up to ``timeout_s`` for it."""
    if cache is None:
        return common.FlushCacheResponse(success=False, message="this worker has no prefix cache")
    deadline = time.monotonic() + max(0.0, float(request.timeout_s))
    while engine.num_running or engine.num_waiting:
        if time.monotonic() >= deadline:
            return common.FlushCacheResponse(
                success=False,
                message=f"{engine.num_running} requests running, {engine.num_waiting} waiting",
            )
        await asyncio.sleep(0.01)
    cache.clear()
    return common.FlushCacheResponse(success=True, message="prefix cache cleared")


class KvEventRpcs:
    """The two RPCs, for a servicer that has an ``engine``; the adapter sets the rest."""

    engine: Engine
    kv_events: KvEventPublisher | None = None  # None: --no-kv-events (UNIMPLEMENTED)
    prefix_cache: ClearableCache | None = None

    def serve_kv_events(
        self, publisher: KvEventPublisher | None, cache: ClearableCache | None
    ) -> None:
        self.kv_events = publisher
        self.prefix_cache = cache

    async def SubscribeKvEvents(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[common.KvEventBatch]:
        async for batch in subscribe(self.kv_events, request, context):
            yield batch

    async def FlushCache(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> common.FlushCacheResponse:
        return await flush(self.prefix_cache, self.engine, request)
