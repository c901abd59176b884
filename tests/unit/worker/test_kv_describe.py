"""The side channel's ``Describe`` and waiting ``Release``, and the media description format.

A real ``tandem.kv.KvTransfer`` server in this process over a real ``KvStore``; the client
is the one decode workers use.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import numpy as np
import pytest
import torch

from tandem.engine.kv_store import KvStore
from tandem.engine.types import MediaInputs, MediaItem, ModelShape
from tandem.worker.kv_channel import KvChannelClient, KvChannelServer, tokens_digest
from tandem.worker.kv_media import MediaDescriptionError, media_from_json, media_to_json

SHAPE = ModelShape(num_layers=1, num_kv_heads=1, head_dim=2, vocab_size=64, max_context=64)
GRID = np.array([[1, 4, 4], [1, 2, 6]], dtype=np.int64)


def described_media() -> MediaInputs:
    items = [MediaItem("h0", 2, 4), MediaItem("h1", 8, 3)]
    pixels = np.ones((28, 6), dtype=np.float32)
    return MediaInputs(items, 9, pixels, {"image_grid_thw": GRID}, video_pixel_values=pixels)


def test_the_description_round_trips_without_pixels() -> None:
    data = media_to_json(described_media())
    assert data is not None and "pixel_values" not in str(data)
    back = media_from_json(data)
    assert back is not None
    assert back.items == described_media().items and back.im_token_id == 9
    assert back.pixel_values is None and back.video_pixel_values is None
    np.testing.assert_array_equal(back.grids["image_grid_thw"], GRID)
    assert back.grids["image_grid_thw"].dtype == np.int64
    assert media_to_json(None) is None and media_from_json(None) is None
    assert media_to_json(MediaInputs([])) is None


@pytest.mark.parametrize(
    "bad",
    [
        [],
        {"items": "x"},
        {"items": [{"mm_hash": "", "offset": 0, "length": 1}]},
        {"items": [{"mm_hash": "h", "offset": -1, "length": 1}]},
        {"items": [{"mm_hash": "h", "offset": True, "length": 1}]},
        {"items": [{"mm_hash": "h", "offset": 0, "length": 1, "modality": "audio"}]},
        {"items": [], "im_token_id": "9"},
        {"items": [], "grids": {"g": {"dtype": "float64", "shape": [1], "data": ""}}},
        {"items": [], "grids": {"g": {"dtype": "int64", "shape": [2], "data": "AAAA"}}},
        {"items": [], "grids": {"g": {"dtype": "int64", "shape": [1], "data": "!!"}}},
    ],
)
def test_a_malformed_description_is_refused(bad: object) -> None:
    with pytest.raises(MediaDescriptionError):
        media_from_json(bad)


@pytest.fixture
async def channel():
    store = KvStore(SHAPE)
    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    server.add_generic_rpc_handlers((KvChannelServer(store, SHAPE, dict).handler(),))
    await server.start()
    client = KvChannelClient(SHAPE)
    try:
        yield store, client, f"127.0.0.1:{port}"
    finally:
        await client.close()
        await server.stop(0)


def _put_later(store: KvStore, transfer_id: str, delay: float) -> asyncio.Task[None]:
    async def put() -> None:
        await asyncio.sleep(delay)
        kv = [(torch.zeros(1, 3, 2), torch.zeros(1, 3, 2))]
        store.put(transfer_id, kv, [4, 5, 6], [], media=described_media())

    return asyncio.get_running_loop().create_task(put())


async def test_describe_waits_for_the_transfer_to_appear(channel) -> None:
    store, client, address = channel
    later = _put_later(store, "t1", 0.2)
    reply = await client.describe(address, "t1", wait_s=5.0)
    await later
    assert reply["num_tokens"] == 3 and reply["tokens_digest"] == tokens_digest([4, 5, 6])
    assert media_from_json(reply["media"]).items == described_media().items  # type: ignore[union-attr]
    assert store.get("t1") is not None, "describing holds on to the KV"


async def test_describe_of_an_absent_transfer_is_not_found_after_its_wait(channel) -> None:
    _, client, address = channel
    started = time.monotonic()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await client.describe(address, "never", wait_s=0.3)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert time.monotonic() - started >= 0.3


async def test_release_may_wait_for_a_transfer_still_being_stored(channel) -> None:
    store, client, address = channel
    assert await client.release(address, "t2") is False
    later = _put_later(store, "t2", 0.2)
    assert await client.release(address, "t2", wait_s=5.0) is True
    await later
    assert store.get("t2") is None
