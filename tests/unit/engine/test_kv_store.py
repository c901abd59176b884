"""KV store for the PD handoff: leases, release, block reads, no leaks.

Expiry is tested with a fake clock (a plain mutable float): leases are about elapsed
time, and sleeping through real seconds would make the suite slow and flaky.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tandem.engine.kv_store import KvStore, TransferNotFound
from tandem.engine.types import KVLayers, MediaInputs, MediaItem, ModelShape

SHAPE = ModelShape(num_layers=2, num_kv_heads=2, head_dim=3, vocab_size=64, max_context=256)
BS = 4


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_kv(seq_len: int) -> KVLayers:
    shape = (SHAPE.num_kv_heads, seq_len, SHAPE.head_dim)
    g = torch.Generator().manual_seed(seq_len)
    return [(torch.randn(shape, generator=g), torch.randn(shape, generator=g)) for _ in range(2)]


def store(clock: FakeClock | None = None, lease_s: float = 30.0) -> KvStore:
    return KvStore(SHAPE, lease_s=lease_s, clock=clock or FakeClock(), block_size=BS)


def test_put_get_and_counts() -> None:
    clock = FakeClock()
    s = store(clock)
    s.put("t1", make_kv(10), list(range(10)), [b"k0", b"k1"])
    held = s.get("t1")
    assert held is not None
    assert held.num_blocks == 3 and held.num_tokens == 10  # ceil(10 / 4)
    assert held.token_ids == list(range(10)) and held.block_keys == [b"k0", b"k1"]
    assert held.expires_at == clock.now + 30.0
    assert s.held_count == 1 and s.held_blocks == 3
    assert s.held_bytes == 10 * SHAPE.kv_bytes_per_token
    assert s.get("nope") is None


def test_duplicate_id_rejected() -> None:
    s = store()
    s.put("t", make_kv(4), [1, 2, 3, 4], [])
    with pytest.raises(ValueError, match="already holds"):
        s.put("t", make_kv(4), [1, 2, 3, 4], [])


def test_put_validates_layout_and_keys() -> None:
    s = store()
    with pytest.raises(ValueError, match="one position per token id"):
        s.put("t", make_kv(5), [1, 2, 3, 4], [])
    with pytest.raises(ValueError, match="layers"):
        s.put("t", make_kv(4)[:1], [1, 2, 3, 4], [])
    with pytest.raises(ValueError, match="block keys"):
        s.put("t", make_kv(7), list(range(7)), [b"a", b"b"])  # only 1 full block
    with pytest.raises(ValueError, match="non-empty"):
        s.put("", make_kv(4), [1, 2, 3, 4], [])
    assert s.held_count == 0


def test_read_blocks_ranges_including_partial_last_block() -> None:
    s = store()
    kv = make_kv(10)
    s.put("t", kv, list(range(10)), [])
    first = s.read_blocks("t", 0, 1)
    assert torch.equal(first[1][0], kv[1][0][:, 0:4])
    tail = s.read_blocks("t", 1, 3)
    assert tail[0][1].shape == (2, 6, 3)  # 4 + the partial 2
    assert torch.equal(tail[0][1], kv[0][1][:, 4:10])
    whole = s.read_blocks("t", 0, 3)
    assert all(torch.equal(a, b) for (a, _), (b, _) in zip(whole, kv, strict=True))
    assert whole[0][0].is_contiguous()


@pytest.mark.parametrize(("start", "end"), [(-1, 1), (0, 4), (2, 2), (3, 1), (3, 4)])
def test_read_blocks_bounds_errors(start: int, end: int) -> None:
    s = store()
    s.put("t", make_kv(10), list(range(10)), [])
    with pytest.raises(ValueError, match=r"outside \[0, 3\)"):
        s.read_blocks("t", start, end)


def test_read_unknown_id_raises_not_found() -> None:
    with pytest.raises(TransferNotFound, match="no KV held for transfer id 'x'"):
        store().read_blocks("x", 0, 1)
    assert issubclass(TransferNotFound, KeyError)


def test_release_is_idempotent() -> None:
    s = store()
    s.put("t", make_kv(8), list(range(8)), [])
    assert s.release("t") is True
    assert s.release("t") is False
    assert s.release("never") is False
    assert s.released == 1 and s.held_count == 0 and s.get("t") is None


def test_expiry_frees_everything_and_counts() -> None:
    clock = FakeClock()
    s = store(clock, lease_s=10.0)
    s.put("old", make_kv(8), list(range(8)), [])
    clock.now += 6
    s.put("new", make_kv(5), list(range(5)), [])
    assert s.expire() == 0
    clock.now += 4  # "old" is exactly at its expiry
    assert s.expire() == 1
    assert s.get("old") is None and s.get("new") is not None
    assert s.expire(now=clock.now + 100) == 1
    assert s.held_count == 0 and s.held_blocks == 0 and s.held_bytes == 0
    assert s.expired == 2 and s.released == 0


def test_get_and_read_expire_opportunistically() -> None:
    clock = FakeClock()
    s = store(clock, lease_s=5.0)
    s.put("t", make_kv(4), [1, 2, 3, 4], [])
    clock.now += 5
    assert s.get("t") is None
    assert s.expired == 1
    s.put("u", make_kv(4), [1, 2, 3, 4], [])
    clock.now += 5
    with pytest.raises(TransferNotFound):
        s.read_blocks("u", 0, 1)
    assert s.release("u") is False  # already expired, not double counted
    assert s.expired == 2 and s.released == 0


def test_expired_id_can_be_reused() -> None:
    clock = FakeClock()
    s = store(clock, lease_s=1.0)
    s.put("t", make_kv(4), [1, 2, 3, 4], [])
    clock.now += 2
    s.put("t", make_kv(4), [1, 2, 3, 4], [])  # the stale entry is swept first
    assert s.held_count == 1 and s.stored == 2


def test_invalid_construction() -> None:
    with pytest.raises(ValueError, match="lease_s"):
        KvStore(SHAPE, lease_s=0)
    with pytest.raises(ValueError, match="block_size"):
        KvStore(SHAPE, block_size=0)


def test_the_media_description_is_held_without_pixels() -> None:
    s = store()
    grid = np.array([[1, 4, 4]], dtype=np.int64)
    pixels = np.ones((16, 6), dtype=np.float32)
    media = MediaInputs([MediaItem("h", 1, 4)], 9, pixels, {"image_grid_thw": grid}, pixels)
    s.put("t", make_kv(8), list(range(8)), [b"k0", b"k1"], media=media)
    held = s.get("t")
    assert held is not None and held.media is not None
    assert held.media.pixel_values is None and held.media.video_pixel_values is None
    assert held.media.items == media.items and held.media.im_token_id == 9
    np.testing.assert_array_equal(held.media.grids["image_grid_thw"], grid)
    assert media.pixel_values is pixels, "the caller's media stay as they were"
    s.put("text", make_kv(4), [1, 2, 3, 4], [])
    assert s.get("text").media is None  # type: ignore[union-attr]
