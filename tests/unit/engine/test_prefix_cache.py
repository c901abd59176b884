"""Prefix cache: hits, LRU eviction under a byte budget, exact and independent copies."""

from __future__ import annotations

import threading

import pytest
import torch

from tandem.engine.block_keys import block_keys
from tandem.engine.prefix_cache import PrefixCache
from tandem.engine.types import KVLayers, ModelShape

SHAPE = ModelShape(num_layers=2, num_kv_heads=2, head_dim=3, vocab_size=64, max_context=256)
BS = 4
BLOCK_BYTES = BS * SHAPE.kv_bytes_per_token


def make_kv(seq_len: int, seed: int = 0) -> KVLayers:
    g = torch.Generator().manual_seed(seed)
    shape = (SHAPE.num_kv_heads, seq_len, SHAPE.head_dim)
    return [(torch.randn(shape, generator=g), torch.randn(shape, generator=g)) for _ in range(2)]


def keys_for(tokens: list[int], salt: str | None = None) -> list[bytes]:
    return block_keys(tokens, [], salt, BS)


def cache(blocks: int) -> PrefixCache:
    return PrefixCache(SHAPE, byte_budget=blocks * BLOCK_BYTES, block_size=BS)


def test_hit_and_miss_and_stats() -> None:
    c = cache(10)
    keys = keys_for(list(range(12)))
    assert c.lookup(keys) == 0
    assert c.insert(keys, make_kv(12)) == 3
    assert c.lookup(keys) == 3
    assert c.lookup(keys_for([*range(8), 50, 51, 52, 53])) == 2  # diverges in block 2
    assert c.lookup(keys_for(list(range(12)), salt="mm:x")) == 0
    assert c.lookups == 4
    assert c.hits_tokens == (3 + 2) * BS
    assert c.query_tokens == 4 * 3 * BS
    assert c.num_blocks == 3
    assert c.bytes_used == 3 * BLOCK_BYTES


def test_returned_kv_equals_inserted_slices_exactly() -> None:
    c = cache(10)
    kv = make_kv(14)  # 3 full blocks + 2 tokens
    keys = keys_for(list(range(14)))
    c.insert(keys, kv)
    for n in (1, 3):
        got = c.get_prefix(keys, n)
        assert len(got) == SHAPE.num_layers
        for (k, v), (gk, gv) in zip(kv, got, strict=True):
            assert torch.equal(gk, k[:, : n * BS]) and torch.equal(gv, v[:, : n * BS])
    n, matched = c.match(keys)
    assert n == 3 and torch.equal(matched[1][1], kv[1][1][:, :12])


def test_get_prefix_of_zero_blocks_is_empty_kv() -> None:
    got = cache(2).get_prefix([], 0)
    assert [tuple(k.shape) for k, _ in got] == [(2, 0, 3)] * 2


def test_stored_blocks_are_independent_copies() -> None:
    c = cache(10)
    kv = make_kv(8)
    keys = keys_for(list(range(8)))
    c.insert(keys, kv)
    expected = kv[0][0][:, :8].clone()
    kv[0][0].fill_(7.0)  # the caller reuses its buffer
    got = c.get_prefix(keys, 2)
    assert torch.equal(got[0][0], expected)
    got[0][0].fill_(-1.0)  # and modifying what we returned does not reach the cache
    assert torch.equal(c.get_prefix(keys, 2)[0][0], expected)


def test_insert_only_covered_full_blocks() -> None:
    c = cache(10)
    keys = keys_for(list(range(16)))  # 4 keys
    assert c.insert(keys[:2], make_kv(16)) == 2  # kv longer than the keys cover
    assert c.insert(keys, make_kv(10)) == 0  # only 2 full blocks of kv: both present
    assert c.lookup(keys) == 2


def test_lru_evicts_least_recent_chain_tail_first_and_respects_budget() -> None:
    c = cache(4)
    a = keys_for([1] * 8)
    b = keys_for([2] * 8)
    c.insert(a, make_kv(8))
    c.insert(b, make_kv(8))
    c.lookup(a)  # a is now more recent than b
    new = keys_for([3] * 4)
    c.insert(new, make_kv(4))
    assert c.bytes_used <= c.byte_budget
    assert c.lookup(a) == 2
    assert c.lookup(b) == 1  # b lost its tail, its head still serves a prefix
    assert c.evicted_blocks == 1


def test_budget_never_exceeded_under_churn() -> None:
    c = cache(5)
    for i in range(30):
        c.insert(keys_for([i] * (4 * (1 + i % 4))), make_kv(4 * (1 + i % 4), seed=i))
        assert c.bytes_used <= c.byte_budget
        assert c.num_blocks <= 5


def test_chain_longer_than_the_cache_keeps_its_head() -> None:
    c = cache(2)
    keys = keys_for(list(range(20)))
    c.insert(keys, make_kv(20))
    assert c.lookup(keys) == 2


def test_zero_budget_disables_caching() -> None:
    c = PrefixCache(SHAPE, byte_budget=0, block_size=BS)
    keys = keys_for(list(range(8)))
    assert not c.enabled
    assert c.insert(keys, make_kv(8)) == 0
    assert c.lookup(keys) == 0 and c.num_blocks == 0 and c.bytes_used == 0
    # A budget smaller than one block is the same as none.
    assert PrefixCache(SHAPE, byte_budget=BLOCK_BYTES - 1, block_size=BS).capacity_blocks == 0


def test_get_prefix_of_evicted_block_raises() -> None:
    c = cache(1)
    a, b = keys_for([1] * 4), keys_for([2] * 4)
    c.insert(a, make_kv(4))
    c.insert(b, make_kv(4))
    with pytest.raises(KeyError, match="no longer cached"):
        c.get_prefix(a, 1)
    with pytest.raises(ValueError, match="n_blocks"):
        c.get_prefix(b, 2)


def test_wrong_kv_layout_is_rejected() -> None:
    c = cache(4)
    keys = keys_for(list(range(4)))
    with pytest.raises(ValueError, match="layers"):
        c.insert(keys, make_kv(4)[:1])
    bad = [(k.double(), v) for k, v in make_kv(4)]
    with pytest.raises(ValueError, match="float32"):
        c.insert(keys, bad)


def test_concurrent_use_keeps_invariants() -> None:
    c = cache(6)
    errors: list[BaseException] = []

    def work(worker: int) -> None:
        try:
            for i in range(40):
                toks = [worker * 100 + i % 5] * 8
                keys = keys_for(toks)
                c.insert(keys, make_kv(8, seed=i))
                n, kv = c.match(keys)
                assert kv[0][0].shape[1] == n * BS
        except BaseException as exc:  # surfaced in the main thread below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert c.num_blocks <= 6 and c.bytes_used <= c.byte_budget
