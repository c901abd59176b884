"""What a Tandem worker would stream, built from the worker's own pieces, without a worker.

A real ``PrefixCache`` (a tiny model shape, real KV tensors) reports to a real
``KvEventPublisher`` (never started: it applies synchronously and keeps its history),
and the worker's converter turns the batches into ``KvEventBatch`` messages. So what the
gateway's index is fed here is byte for byte what a worker sends for the same prompt.

``serve_kv_events`` puts a publisher behind a real ``grpc.aio`` server on 127.0.0.1
answering the vLLM protocol's ``SubscribeKvEvents`` (the worker's own stream code), plus
``GetModelInfo``/``GetServerInfo``/``HealthCheck`` so the gateway's registry can add it:
a stand-in for a whole worker where only its events matter.

Kept out of conftest.py under a unique module name, like tests/unit/gateway/workers'.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc
import torch
from smg_grpc_proto.generated import common_pb2 as common

from tandem.engine.block_keys import block_keys
from tandem.engine.kv_events import BlockSource
from tandem.engine.prefix_cache import PrefixCache
from tandem.engine.types import MediaItem, ModelShape
from tandem.wire.proto import pb, pb_grpc
from tandem.worker.kv_events.convert import to_pb
from tandem.worker.kv_events.publisher import Batch, KvEventPublisher, LoadFigures
from tandem.worker.kv_events.stream import subscribe

SHAPE = ModelShape(num_layers=1, num_kv_heads=1, head_dim=2, vocab_size=1000, max_context=4096)
BLOCK = 4  # small blocks: a short prompt spans several


def idle_load() -> LoadFigures:
    return LoadFigures(
        running=0, waiting=0, waiting_uncached_tokens=0, token_usage=0.0, max_running=0
    )


class WorkerCache:
    """One worker's prefix cache and its publisher."""

    def __init__(self, capacity_blocks: int = 1000, block_size: int = BLOCK) -> None:
        self.block_size = block_size
        budget = capacity_blocks * block_size * SHAPE.kv_bytes_per_token
        self.cache = PrefixCache(SHAPE, budget, block_size)
        self.publisher = KvEventPublisher(idle_load, heartbeat_s=0.2)
        self.cache.set_listener(self.publisher)
        self._sent = 0  # history batches already handed out by new_batches()

    def prefill(
        self, token_ids: Sequence[int], media: Sequence[MediaItem] = (), salt: str | None = None
    ) -> int:
        """Cache ``token_ids`` as the engine's prefill does; returns the blocks added."""
        keys = block_keys(token_ids, media, salt, self.block_size)
        kv = [(torch.zeros(1, len(token_ids), 2), torch.zeros(1, len(token_ids), 2))]
        source = BlockSource(token_ids, media, salt, self.block_size)
        return self.cache.insert(keys, kv, source)

    def new_batches(self) -> list[common.KvEventBatch]:
        """The batches published since the last call, as the stream sends them."""
        history = list(self.publisher._history)  # the worker's replay buffer
        fresh = [b for b in history if b.sequence > self._sent]
        if fresh:
            self._sent = fresh[-1].sequence
        return [wire(b) for b in fresh]

    def snapshot(self) -> list[common.KvEventBatch]:
        return [wire(b) for b in self.publisher.snapshot()]


def wire(batch: Batch) -> common.KvEventBatch:
    return to_pb(batch, idle_load(), batch.sequence)


async def until(check: Callable[[], bool], within_s: float = 5.0) -> None:
    """Wait for ``check()`` to hold; fail after ``within_s``."""
    deadline = time.monotonic() + within_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


def image_prompt(text: Sequence[int], pad: int, run: int, tail: Sequence[int]) -> list[int]:
    """``text``, an image placeholder run of ``run`` ``pad`` ids, then ``tail``."""
    return [*text, *([pad] * run), *tail]


# -- a stand-in worker on loopback --------------------------------------------------------


class EventsServicer(pb_grpc.VllmEngineServicer):
    """Discovery answers and the real SubscribeKvEvents stream over ``publisher``
    (``None``: the worker publishes nothing, UNIMPLEMENTED like ``--no-kv-events``)."""

    def __init__(self, publisher: KvEventPublisher | None) -> None:
        self.publisher = publisher

    async def GetModelInfo(self, request: Any, context: Any) -> pb.GetModelInfoResponse:
        return pb.GetModelInfoResponse(
            model_path="/models/stand-in", is_generation=True, max_context_length=4096
        )

    async def GetServerInfo(self, request: Any, context: Any) -> pb.GetServerInfoResponse:
        return pb.GetServerInfoResponse(server_type="vllm-grpc")

    async def HealthCheck(self, request: Any, context: Any) -> pb.HealthCheckResponse:
        return pb.HealthCheckResponse(healthy=True)

    async def SubscribeKvEvents(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[common.KvEventBatch]:
        async for batch in subscribe(self.publisher, request, context):
            yield batch


class EventsWorker:
    """A grpc.aio server on 127.0.0.1 with :class:`EventsServicer`; restartable on its port."""

    def __init__(self, publisher: KvEventPublisher | None) -> None:
        self.publisher = publisher
        self.port = 0
        self._server: grpc.aio.Server | None = None

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        server = grpc.aio.server()
        pb_grpc.add_VllmEngineServicer_to_server(EventsServicer(self.publisher), server)
        self.port = server.add_insecure_port(f"127.0.0.1:{self.port}")
        if self.port == 0:
            raise RuntimeError("could not bind a loopback port")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=None)
            self._server = None
