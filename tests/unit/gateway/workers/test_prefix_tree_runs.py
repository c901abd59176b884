"""The radix form of cache_aware's prefix tree against the plain one: a node per key.

``PrefixTree`` keeps a run of keys in one node (a fresh 1 000-token prompt is one node,
not 60, and is shed in one step); this checks, on random prompts that share, diverge and
overflow the bound, that it answers every match and keeps every size exactly as a tree
with one node per key and least-recently-used leaf eviction does.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Hashable

import pytest

from tandem.gateway.workers.policies.cache_aware import PrefixTree

Path = list[tuple[Hashable, int]]


class _PlainNode:
    def __init__(self, key: Hashable, parent: _PlainNode | None) -> None:
        self.key, self.parent, self.tick = key, parent, 0
        self.children: dict[Hashable, _PlainNode] = {}


class PlainTree:
    """One node per key; the least recently used leaf goes first (ties: pushed first)."""

    def __init__(self, max_nodes: int) -> None:
        self.max_nodes, self.size, self._tick = max_nodes, 0, 0
        self.root = _PlainNode(None, None)
        self.heap: list[tuple[int, int, _PlainNode]] = []
        self.seq = itertools.count()

    def match(self, path: Path) -> int:
        node, matched = self.root, 0
        for key, weight in path:
            if key not in node.children:
                break
            node, matched = node.children[key], matched + weight
        return matched

    def insert(self, path: Path) -> None:
        self._tick += 1
        node = self.root
        for key, _ in path:
            node.tick = self._tick
            if key not in node.children:
                node.children[key] = _PlainNode(key, node)
                self.size += 1
            node = node.children[key]
        node.tick = self._tick
        if node is not self.root and not node.children:
            heapq.heappush(self.heap, (node.tick, next(self.seq), node))
        while self.size > self.max_nodes:
            tick, _, leaf = heapq.heappop(self.heap)
            if leaf.parent is None or leaf.children or leaf.tick != tick:
                continue
            parent = leaf.parent
            del parent.children[leaf.key]
            leaf.parent = None
            self.size -= 1
            if not parent.children and parent is not self.root:
                heapq.heappush(self.heap, (parent.tick, next(self.seq), parent))


def _random_path(rng: random.Random, stems: list[Path]) -> Path:
    """A prompt that often repeats a stored one's prefix and then goes its own way."""
    path: Path = []
    if stems and rng.random() < 0.7:
        stem = rng.choice(stems)
        path = list(stem[: rng.randint(0, len(stem))])
    for _ in range(rng.randint(0 if path else 1, 12)):
        key = rng.randrange(6)
        path.append(((key,) * 2, 2) if rng.random() < 0.5 else (("mm", f"h{key}"), 5))
    return path


@pytest.mark.parametrize("seed", range(12))
def test_runs_answer_as_a_node_per_key_does(seed: int) -> None:
    rng = random.Random(seed)
    bound = rng.choice([3, 8, 20, 60])
    runs, plain = PrefixTree(bound), PlainTree(bound)
    stems: list[Path] = []
    for _ in range(400):
        path = _random_path(rng, stems)
        stems = [*stems, path][-8:]
        probe = _random_path(rng, stems)
        assert runs.match(probe) == plain.match(probe)
        runs.insert(path)
        plain.insert(path)
        assert runs.size == plain.size <= bound
        for stored in stems:
            assert runs.match(stored) == plain.match(stored)


def test_a_fresh_prompt_is_one_node_and_is_shed_whole() -> None:
    tree = PrefixTree(max_nodes=100)
    first = [((i,), 1) for i in range(60)]
    tree.insert(first)
    assert tree.size == 60 and len(tree._leaves) == 1
    tree.insert([((1000 + i,), 1) for i in range(60)])  # 120 keys: the first loses 20
    assert tree.size == 100
    assert tree.match(first) == 40
