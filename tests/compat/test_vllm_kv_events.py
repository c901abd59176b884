"""A real vLLM CPU worker's KV events, relayed by smg-grpc-servicer over SubscribeKvEvents,
followed by Tandem's gateway index (issue 36, item 3; docs/architecture.md "Routing from the
workers' KV events").

One aggregated vLLM worker (``--kv-events-config`` with its ZMQ publisher on ipc://
sockets in a folder of its own; ``--block-size 32``, the smallest the CPU attention backend
takes, as its default would hold no whole block of these short prompts) behind a Tandem
gateway with ``--policy kv_events``. The test keeps an index of its own from the same
stream, with the gateway's own classes: a text prompt's content keys (its token ids from
the gateway's /tokenize) must find every whole block vLLM stored, an image prompt's blocks
carry the image's identity, and after FlushCache (vLLM's prefix-cache reset) both indexes,
the test's and the gateway's (its ``tandem_kv_event_blocks``), hold only what came after.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from smg_grpc_proto.generated import common_pb2 as common
from tests.integration.gateway_probe import eventually, metric
from tests.integration.processes import Proc
from tests.integration.wire_helpers import image_data_url

from tandem.engine.builtin import resolve_model
from tandem.gateway.backends.vllm.client import VllmClient
from tandem.gateway.kv_events.index import KvEventIndex
from tandem.gateway.kv_events.keys import request_keys

from .vllm_procs import VllmWorker, start_gateway, start_vllm

pytestmark = [pytest.mark.compat, pytest.mark.slow, pytest.mark.timeout(900)]

MODEL = "tiny-qwen3-vl"
BLOCK = 32
OTHER_TEXT = "Count slowly from one to twenty, writing every number out as words, thanks."
TEXT = "Describe the weather today in a long sentence with many words, please, and be brief."


@pytest.fixture(scope="module")
def stack(model_cache: Path) -> Iterator[tuple[VllmWorker, Proc]]:
    worker = start_vllm("kv", resolve_model(MODEL), MODEL, kv_events=True, block_size=BLOCK)
    worker.wait_ready()
    gateway = start_gateway({"both": worker}, "--policy", "kv_events", "--mm-processing", "router")
    yield worker, gateway
    gateway.stop()
    worker.stop()


class Follower:
    """The test's own subscription: every batch, applied to an index as the gateway does."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.client = VllmClient(url)
        self.index = KvEventIndex()
        self.batches: list[common.KvEventBatch] = []
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for batch in self.client.subscribe_kv_events(0):
            self.batches.append(batch)
            self.index.apply(self.url, batch.events)

    def blocks(self) -> list[common.KvBlock]:
        return [
            block
            for batch in self.batches
            for event in batch.events
            if event.WhichOneof("data") == "stored"
            for block in event.stored.blocks
        ]

    async def close(self) -> None:
        self.task.cancel()
        await self.client.close()


async def chat(gateway: Proc, content: object) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 2}
    async with httpx.AsyncClient(timeout=120) as http:
        reply = await http.post(f"{gateway.address}/v1/chat/completions", json=body)
    assert reply.status_code == 200, reply.text


async def prompt_ids(gateway: Proc, text: str) -> list[int]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}]}
    async with httpx.AsyncClient(timeout=60) as http:
        reply = await http.post(f"{gateway.address}/tokenize", json=body)
    assert reply.status_code == 200, reply.text
    return list(reply.json()["tokens"])


async def gateway_holds(gateway: Proc, blocks: int) -> bool:
    return blocks > 0 and await metric(gateway, "tandem_kv_event_blocks") == blocks


async def test_the_index_follows_a_real_vllm_worker(stack) -> None:
    worker, gateway = stack
    follower = Follower(worker.address)
    try:
        await asyncio.sleep(1.0)  # the relay's stream is live only: subscribe first
        ids = await prompt_ids(gateway, TEXT)
        assert len(ids) >= 2 * BLOCK
        await chat(gateway, TEXT)
        keys = request_keys(ids, (), BLOCK)

        def found() -> int:
            return follower.index.leading_blocks(keys, [worker.address])[worker.address]

        # Every whole block of the prompt, keyed by content alone, is what vLLM announced.
        await eventually(lambda: found() == len(keys), timeout=30)
        # The gateway's own subscription holds the same blocks.
        await eventually(lambda: gateway_holds(gateway, follower.index.blocks(worker.address)))

        image = {"type": "image_url", "image_url": {"url": image_data_url(21, (64, 48))}}
        before = len(follower.blocks())
        await chat(gateway, [image, {"type": "text", "text": "What is this?"}])
        await eventually(lambda: len(follower.blocks()) > before, timeout=30)
        identities = {
            key.multimodal.identifier
            for block in follower.blocks()[before:]
            for key in block.extra_keys
            if key.HasField("multimodal")
        }
        assert len(identities) == 1, follower.blocks()[before:]

        channel = grpc.aio.insecure_channel(worker.address)
        try:
            flush = channel.unary_unary(
                "/vllm.grpc.engine.VllmEngine/FlushCache",
                request_serializer=common.FlushCacheRequest.SerializeToString,
                response_deserializer=common.FlushCacheResponse.FromString,
            )
            reply = await flush(common.FlushCacheRequest(timeout_s=10), timeout=30)
            assert reply.success, reply.message
        finally:
            await channel.close()
        # vLLM hands its events to the publisher when the engine steps: the reset's
        # KvCacheCleared goes out with the next request's stores.
        await chat(gateway, OTHER_TEXT)

        def cleared() -> bool:
            return any(
                e.WhichOneof("data") == "cleared" for b in follower.batches for e in b.events
            )

        await eventually(cleared, timeout=30)
        await eventually(lambda: found() == 0, timeout=30)
        # The gateway's index went through the same clear: it holds what the follower holds,
        # the new request's blocks only.
        await eventually(lambda: gateway_holds(gateway, follower.index.blocks(worker.address)))
    finally:
        await follower.close()
