"""The embedding side channel through a real gRPC server on 127.0.0.1: features arrive bit
for bit with their digest, a pull waits for an encode still running, gives up with
NOT_FOUND, fails fast on a failed encode, takes its entry, and leases run out."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc
import pytest
import torch

from tandem.engine.types import ImageFeatures
from tandem.worker.embedding_channel import (
    EmbeddingChannelServer,
    EmbeddingClient,
    EmbeddingFailed,
    EmbeddingNotFound,
    EmbeddingStore,
)
from tandem.worker.embedding_frames import (
    EmbeddingFrameError,
    FeaturesReader,
    encode_features,
)


def features(tokens: int, hidden: int, deepstack: int, seed: int = 0) -> ImageFeatures:
    g = torch.Generator().manual_seed(seed)
    return ImageFeatures(
        torch.randn(tokens, hidden, generator=g),
        [torch.randn(tokens, hidden, generator=g) for _ in range(deepstack)],
    )


def assert_same(a: ImageFeatures, b: ImageFeatures) -> None:
    assert a.embeds.dtype == b.embeds.dtype == torch.float32
    assert torch.equal(a.embeds, b.embeds)
    assert len(a.deepstack) == len(b.deepstack)
    for x, y in zip(a.deepstack, b.deepstack, strict=True):
        assert torch.equal(x, y)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def channel() -> AsyncIterator[tuple[EmbeddingStore, EmbeddingClient, str]]:
    store = EmbeddingStore(lease_s=30.0)
    # The worker's own limits (worker/server.py): frames stay far below them anyway.
    server = grpc.aio.server(options=[("grpc.max_send_message_length", 256 << 20)])
    port = server.add_insecure_port("127.0.0.1:0")
    server.add_generic_rpc_handlers((EmbeddingChannelServer(store).handler(),))
    await server.start()
    client = EmbeddingClient(timeout_s=10.0)
    try:
        yield store, client, f"127.0.0.1:{port}"
    finally:
        await client.close()
        await server.stop(0)


@pytest.mark.parametrize(
    ("tokens", "hidden", "deepstack"),
    [(16, 64, 2), (64, 64, 0), (400, 2048, 3)],  # the last: 13 MB, in 1 MiB frames
)
async def test_round_trip_is_bit_for_bit(
    channel: tuple[EmbeddingStore, EmbeddingClient, str], tokens: int, hidden: int, deepstack: int
) -> None:
    store, client, address = channel
    sent = features(tokens, hidden, deepstack)
    store.put("room-1", "digest-abc", sent)
    pulled = await client.pull(address, "room-1", 0.0)
    assert pulled.digest == "digest-abc"
    assert_same(pulled.features, sent)
    assert store.counters() == {"held": 0, "stored": 1, "taken": 1, "expired": 0, "failed": 0}


async def test_a_pull_waits_for_the_encode(
    channel: tuple[EmbeddingStore, EmbeddingClient, str],
) -> None:
    store, client, address = channel
    sent = features(8, 16, 1)

    async def encode_later() -> None:
        await asyncio.sleep(0.2)
        store.put("room-2", "d2", sent)

    task = asyncio.create_task(encode_later())
    started = time.monotonic()
    pulled = await client.pull(address, "room-2", 5.0)
    assert 0.15 < time.monotonic() - started < 3.0
    assert_same(pulled.features, sent)
    await task


async def test_an_encode_on_another_thread_wakes_the_pull(
    channel: tuple[EmbeddingStore, EmbeddingClient, str],
) -> None:
    store, client, address = channel
    loop = asyncio.get_running_loop()
    pull = asyncio.create_task(client.pull(address, "room-t", 5.0))
    await asyncio.sleep(0.1)
    await loop.run_in_executor(None, store.put, "room-t", "dt", features(4, 8, 0))
    pulled = await asyncio.wait_for(pull, 2.0)
    assert pulled.digest == "dt"


async def test_not_found_after_the_wait(
    channel: tuple[EmbeddingStore, EmbeddingClient, str],
) -> None:
    _, client, address = channel
    started = time.monotonic()
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await client.pull(address, "room-missing", 0.3)
    assert 0.25 < time.monotonic() - started < 3.0
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert "room-missing" in (caught.value.details() or "")


async def test_a_failed_encode_answers_at_once(
    channel: tuple[EmbeddingStore, EmbeddingClient, str],
) -> None:
    store, client, address = channel
    pull = asyncio.create_task(client.pull(address, "room-3", 30.0))
    await asyncio.sleep(0.1)
    started = time.monotonic()
    store.fail("room-3", "pixel values have 3 rows; the grid needs 64")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await pull
    assert time.monotonic() - started < 2.0
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    details = caught.value.details() or ""
    assert "room-3" in details and "the grid needs 64" in details
    assert store.counters()["failed"] == 1 and store.held == 0


async def test_an_entry_is_taken_once(
    channel: tuple[EmbeddingStore, EmbeddingClient, str],
) -> None:
    store, client, address = channel
    store.put("room-4", "d4", features(2, 4, 0))
    await client.pull(address, "room-4", 0.0)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await client.pull(address, "room-4", 0.0)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    store.put("room-5", "d5", features(2, 4, 0))
    with pytest.raises(ValueError, match="already holds"):
        store.put("room-5", "d5", features(2, 4, 0))


async def test_a_pull_needs_a_transfer_id(
    channel: tuple[EmbeddingStore, EmbeddingClient, str],
) -> None:
    _, client, address = channel
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await client.pull(address, "", 0.0)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_leases_run_out() -> None:
    clock = Clock()
    store = EmbeddingStore(lease_s=5.0, clock=clock)
    store.put("old", "d", features(2, 4, 0))
    store.fail("broken", "no")
    clock.now += 4.0
    store.put("young", "d", features(2, 4, 0))
    assert store.held == 3
    clock.now += 1.0
    assert store.expire() == 2  # old and broken
    with pytest.raises(EmbeddingNotFound, match="'old'"):
        await store.wait_take("old", 0.0)
    clock.now += 10.0  # young expires lazily, on the next call
    with pytest.raises(EmbeddingNotFound):
        await store.wait_take("young", 0.0)
    assert store.counters() == {"held": 0, "stored": 2, "taken": 0, "expired": 3, "failed": 1}


async def test_the_store_without_grpc() -> None:
    store = EmbeddingStore()
    store.fail("f", "tower exploded")
    with pytest.raises(EmbeddingFailed, match="tower exploded"):
        await store.wait_take("f", 1.0)
    with pytest.raises(EmbeddingNotFound):  # a failure is answered once, too
        await store.wait_take("f", 0.0)
    with pytest.raises(ValueError):
        store.put("", "d", features(1, 1, 0))
    with pytest.raises(ValueError):
        EmbeddingStore(lease_s=0)


def test_frames_are_checked() -> None:
    sent = features(10, 8, 1)
    frames = list(encode_features("d", sent, chunk_bytes=100))
    assert len(frames) == 1 + 2 * 4  # 320 bytes a tensor, in pieces of 100
    reader = FeaturesReader()
    for frame in frames:
        reader.feed(frame)
    assert_same(reader.result().features, sent)

    short = FeaturesReader()
    for frame in frames[:-1]:
        short.feed(frame)
    with pytest.raises(EmbeddingFrameError, match="ended after"):
        short.result()
    long = FeaturesReader()
    for frame in frames:
        long.feed(frame)
    with pytest.raises(EmbeddingFrameError, match="more than"):
        long.feed(b"\0" * 4)
    for header in (
        b"not json",
        b'{"digest": "d", "dtype": "float16", "tokens": 1, "hidden": 1, "deepstack": 0}',
        b'{"digest": "d", "dtype": "float32", "tokens": 0, "hidden": 1, "deepstack": 0}',
        b'{"digest": "d", "dtype": "float32", "tokens": 1, "hidden": true, "deepstack": 0}',
        b'{"digest": "d", "dtype": "float32", "tokens": 65536, "hidden": 65536, "deepstack": 0}',
        b'{"dtype": "float32", "tokens": 1, "hidden": 1, "deepstack": 0}',
    ):
        with pytest.raises(EmbeddingFrameError):
            FeaturesReader().feed(header)
    with pytest.raises(EmbeddingFrameError, match="before its header"):
        FeaturesReader().result()
    with pytest.raises(ValueError, match="one shape"):
        list(encode_features("d", ImageFeatures(torch.zeros(2, 4), [torch.zeros(3, 4)])))
