"""Cache-aware routing: prefix matching where images count by hash, not placeholder ids."""

from __future__ import annotations

import pytest

from tandem.gateway.workers.policies.base import SelectionInput
from tandem.gateway.workers.policies.cache_aware import CacheAwarePolicy, PrefixTree, prompt_path
from tandem.gateway.workers.worker import Worker

TEXT = list(range(100, 110))  # 10 text tokens before the image
PAD = 7  # the image placeholder id: identical for every image of one size
TAIL = [200, 201]


def image_prompt(mm_hash: str, run: int = 40) -> SelectionInput:
    tokens = [*TEXT, *([PAD] * run), *TAIL]
    return SelectionInput(token_ids=tokens, media_runs=[(len(TEXT), run, mm_hash)])


def pool(n: int = 2) -> list[Worker]:
    return [
        Worker(url=f"127.0.0.1:{7100 + i}", role="regular", labels={}, model_id="m")
        for i in range(n)
    ]


def test_same_text_same_image_goes_to_same_worker_even_when_busier() -> None:
    workers = pool()
    policy = CacheAwarePolicy()
    first = policy.select(workers, image_prompt("hash-a"))
    assert first is workers[0]
    first.in_flight = 5  # a load-only policy would now move away
    assert policy.select(workers, image_prompt("hash-a")) is first


def test_different_image_same_size_shares_only_the_text() -> None:
    workers = pool()
    policy = CacheAwarePolicy()
    a = image_prompt("hash-a")
    b = image_prompt("hash-b")
    assert a.token_ids == b.token_ids  # identical placeholder ids; only the hash differs
    chosen = policy.select(workers, a)
    assert policy.matched_tokens(chosen.url, a) == len(a.token_ids)
    assert policy.matched_tokens(chosen.url, b) == len(TEXT)
    # 10 of 52 tokens is below the 0.5 threshold: b is routed by load instead.
    chosen.in_flight = 1
    assert policy.select(workers, b) is workers[1]


def test_text_only_prefix_match_above_threshold() -> None:
    workers = pool(3)
    policy = CacheAwarePolicy(threshold=0.5)
    base = SelectionInput(token_ids=list(range(20)))
    home = policy.select(workers, base)
    home.in_flight = 3
    longer = SelectionInput(token_ids=[*range(20), 99, 98])  # 20/22 matched
    assert policy.select(workers, longer) is home
    unrelated = SelectionInput(token_ids=[50, 51, 52])
    assert policy.select(workers, unrelated) is not home


def test_image_before_text_diverges_at_the_image() -> None:
    policy = CacheAwarePolicy()
    (w,) = pool(1)
    first = SelectionInput(token_ids=[PAD] * 4 + [1, 2], media_runs=[(0, 4, "x")])
    policy.select([w], first)
    other = SelectionInput(token_ids=[PAD] * 4 + [1, 2], media_runs=[(0, 4, "y")])
    assert policy.matched_tokens(w.url, other) == 0


def test_prompt_path_collapses_runs_and_validates() -> None:
    path = prompt_path(SelectionInput(token_ids=[1, PAD, PAD, 2], media_runs=[(1, 2, "h")]))
    assert path == [((1,), 1), (("mm", "h"), 2), ((2,), 1)]
    tokens = list(range(40))
    path = prompt_path(SelectionInput(token_ids=tokens, media_runs=[(20, 5, "h")]), block=16)
    keys = [tuple(range(16)), tuple(range(16, 20)), ("mm", "h"), tuple(range(25, 40))]
    assert path == [(k, 5 if k[0] == "mm" else len(k)) for k in keys]
    with pytest.raises(ValueError):
        prompt_path(SelectionInput(token_ids=[1, 2], media_runs=[(1, 5, "h")]))
    with pytest.raises(ValueError):
        prompt_path(SelectionInput(token_ids=[1, 2, 3, 4], media_runs=[(0, 2, "a"), (1, 2, "b")]))


def test_tree_is_bounded_and_evicts_least_recently_used_leaves() -> None:
    tree = PrefixTree(max_nodes=10)
    old = [(t, 1) for t in (1, 2, 3, 4, 5)]
    new = [(t, 1) for t in (9, 8, 7, 6, 5)]
    tree.insert(old)
    tree.insert(new)
    assert tree.size == 10
    tree.insert([(t, 1) for t in (9, 8, 7, 6, 5, 4, 3)])  # +2 nodes: evict 2 oldest leaves
    assert tree.size == 10
    assert tree.match(old) == 3  # the old branch lost its tail
    assert tree.match(new) == 5
    for i in range(200):
        tree.insert([(1000 + i, 1), (i, 1)])
        assert tree.size <= 10


def test_recently_matched_internal_node_outlives_older_leaves() -> None:
    tree = PrefixTree(max_nodes=6)
    tree.insert([(1, 1), (2, 1), (3, 1)])  # path A
    tree.insert([(7, 1), (8, 1)])  # path B
    tree.insert([(1, 1)])  # touch A's first node only
    tree.insert([(20, 1), (21, 1)])  # 7 nodes: evicts a leaf of the oldest use
    assert tree.size == 6
    assert tree.match([(1, 1), (2, 1), (3, 1)]) == 2
    assert tree.match([(7, 1), (8, 1)]) == 2
    # Two more evictions: A's node 2 (oldest), then B's leaf (older than A's node 1,
    # which became a leaf but was used more recently).
    tree.insert([(30, 1), (31, 1)])
    assert tree.match([(1, 1), (2, 1)]) == 1
    assert tree.match([(7, 1), (8, 1)]) == 1


def test_policy_bound_and_remove_worker() -> None:
    (w,) = pool(1)
    policy = CacheAwarePolicy(max_nodes=32)
    for i in range(50):
        policy.select([w], SelectionInput(token_ids=[i, *range(10)]))
        assert policy.tree_size(w.url) <= 32
    policy.remove_worker(w.url)
    assert policy.tree_size(w.url) == 0


def test_empty_prompt_falls_back_to_least_loaded() -> None:
    workers = pool()
    workers[0].in_flight = 2
    assert CacheAwarePolicy().select(workers, SelectionInput()) is workers[1]


@pytest.mark.parametrize("threshold", [-0.1, 1.5])
def test_threshold_validated(threshold: float) -> None:
    with pytest.raises(ValueError):
        CacheAwarePolicy(threshold=threshold)


def test_text_matches_in_whole_blocks_like_a_worker_cache() -> None:
    (w,) = pool(1)
    policy = CacheAwarePolicy()
    policy.select([w], SelectionInput(token_ids=list(range(40))))
    # Diverging at token 20: the first block (16) is shared, the second is not.
    diverged = SelectionInput(token_ids=[*range(20), 999, *range(21, 40)])
    assert policy.matched_tokens(w.url, diverged) == 16
    assert policy.matched_tokens(w.url, SelectionInput(token_ids=list(range(40)))) == 40
    # A prefix ending inside a block matches that block only when it is the same span.
    assert policy.matched_tokens(w.url, SelectionInput(token_ids=list(range(36)))) == 32
