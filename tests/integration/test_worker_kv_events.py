"""Tandem workers publish their KV events over every protocol that has SubscribeKvEvents
(issue 36, item 1; docs/worker-protocols.md "KV events").

Real ``tandem worker`` processes (the embedded tiny model: only it fills a prefix cache),
one per protocol, each behind its own gateway (``--backend auto``) that sends the requests;
the test subscribes to the worker itself, as a gateway replica or smg would, and checks the
stream against the worker's own counters: a snapshot first, the blocks an image request
stored (with the image's hash), FlushCache's clear, and UNIMPLEMENTED with --no-kv-events.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from smg_grpc_proto.generated import common_pb2 as common

from .image_server import png_bytes
from .processes import Proc, start_all
from .wire_helpers import stats

pytestmark = pytest.mark.slow

MODEL = "tiny-qwen3-vl"
SERVICES = {
    "vllm": "vllm.grpc.engine.VllmEngine",
    "sglang": "sglang.grpc.scheduler.SglangScheduler",
    "tokenspeed": "tokenspeed.grpc.scheduler.TokenSpeedScheduler",
    "trtllm": "trtllm.TrtllmService",
}
FLUSHABLE = ("vllm", "sglang", "tokenspeed")  # TensorRT-LLM's service has no FlushCache


@pytest.fixture(scope="module")
def stack(model_cache: Path) -> Iterator[dict[str, tuple[Proc, Proc]]]:
    names = [*SERVICES, "quiet"]
    specs = [["worker", "--model", MODEL, "--protocol", p] for p in SERVICES]
    specs.append(["worker", "--model", MODEL, "--no-kv-events"])
    workers = start_all(specs)
    gateways = start_all([["gateway", "--port", "0", "--worker-urls", w.address] for w in workers])
    yield {n: (w, g) for n, w, g in zip(names, workers, gateways, strict=True)}
    for proc in gateways + workers:
        proc.stop()


def _grpc_target(worker: Proc) -> str:
    return worker.address.removeprefix("grpc://")


class Subscription:
    """One SubscribeKvEvents stream, read in the background into ``batches``."""

    def __init__(self, worker: Proc, protocol: str) -> None:
        self.channel = grpc.aio.insecure_channel(_grpc_target(worker))
        self.service = SERVICES[protocol]
        self.batches: list[common.KvEventBatch] = []
        self._task: asyncio.Task[None] | None = None

    def stream(self) -> AsyncIterator[common.KvEventBatch]:
        call = self.channel.unary_stream(
            f"/{self.service}/SubscribeKvEvents",
            request_serializer=common.SubscribeKvEventsRequest.SerializeToString,
            response_deserializer=common.KvEventBatch.FromString,
        )
        stream: AsyncIterator[common.KvEventBatch] = call(
            common.SubscribeKvEventsRequest(start_sequence_number=0)
        )
        return stream

    async def __aenter__(self) -> Subscription:
        async def read() -> None:
            async for batch in self.stream():
                self.batches.append(batch)

        self._task = asyncio.create_task(read())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await self.channel.close()

    def events(self, kind: str) -> list[common.KvCacheEvent]:
        return [e for b in self.batches for e in b.events if e.WhichOneof("data") == kind]

    async def until(self, check: object, within_s: float = 10.0) -> None:
        for _ in range(int(within_s / 0.05)):
            if check():  # type: ignore[operator]
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"not reached in {within_s} s; batches: {self.batches}")


async def chat_with_image(gateway: Proc) -> None:
    url = "data:image/png;base64," + base64.b64encode(png_bytes(3)).decode()
    content = [
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": "what is in this picture? answer in a few words please"},
    ]
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 2}
    async with httpx.AsyncClient(timeout=60) as http:
        reply = await http.post(f"{gateway.address}/v1/chat/completions", json=body)
    assert reply.status_code == 200, reply.text


@pytest.mark.parametrize("protocol", list(SERVICES))
async def test_the_stream_follows_the_workers_prefix_cache(stack, protocol: str) -> None:
    worker, gateway = stack[protocol]
    async with Subscription(worker, protocol) as sub:
        await sub.until(lambda: bool(sub.batches))
        first = sub.batches[0]
        assert first.HasField("snapshot") and first.events[0].WhichOneof("data") == "cleared"
        await chat_with_image(gateway)
        held = int((await stats(worker.address))["prefix_cache_blocks"])
        assert held > 0
        stored = lambda: [b for e in sub.events("stored") for b in e.stored.blocks]  # noqa: E731
        await sub.until(lambda: len(stored()) >= held)
        blocks = stored()
        assert all(len(b.token_ids) == b.block_size > 0 for b in blocks)
        images = {k.multimodal.identifier for b in blocks for k in b.extra_keys}
        assert len(images) == 1 and len(images.pop()) >= 16  # the one image's hash
        sequences = [b.sequence_number for b in sub.batches if not b.load.load_only]
        assert sequences == sorted(sequences) and len(set(sequences)) == len(sequences)
        if protocol in FLUSHABLE:
            flush = sub.channel.unary_unary(
                f"/{SERVICES[protocol]}/FlushCache",
                request_serializer=common.FlushCacheRequest.SerializeToString,
                response_deserializer=common.FlushCacheResponse.FromString,
            )
            reply = await flush(common.FlushCacheRequest(timeout_s=5), timeout=10)
            assert reply.success, reply.message
            await sub.until(lambda: len(sub.events("cleared")) >= 2)  # the snapshot's + this
            assert int((await stats(worker.address))["prefix_cache_blocks"]) == 0


async def test_a_worker_without_events_answers_unimplemented(stack) -> None:
    worker, _ = stack["quiet"]
    sub = Subscription(worker, "vllm")
    try:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in sub.stream():
                break
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert "--no-kv-events" in (info.value.details() or "")
    finally:
        await sub.channel.close()
