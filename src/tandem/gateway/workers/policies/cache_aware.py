"""Cache-aware routing: send a request where its prompt prefix is probably cached.

The policy keeps, per worker, an approximate prefix tree of the prompts it sent
there. Text is keyed in blocks of ``BLOCK_TOKENS`` token ids, as the workers' own
prefix caches are (a block is reusable only whole); the last, shorter block of a
text span matches only when identical. Blocks rather than single tokens keep the
tree walk short: a 1 000-token prompt is about 60 steps, not 1 000, which is most
of the routing cost of a long prompt. An image's placeholder run is keyed by
the image's hash as one edge weighing the run's length: every image of a given
size expands to the *same* placeholder ids, so keying by ids would claim that two
different images share a cached prefix (they do not: the worker's cache keys
include the media hash). Same text + different image therefore matches only up
to the image.

Selection: the longest match wins if it covers at least ``threshold`` of the
prompt; otherwise the least-loaded worker takes it. The chosen worker's tree then
records the prompt. Trees are bounded (``max_nodes`` per worker) and shed their
least recently used leaves first, like the workers' own caches.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable, Sequence

from tandem.gateway.workers.policies.base import BasePolicy, SelectionInput
from tandem.gateway.workers.worker import Worker

Key = Hashable  # a tuple of token ids (one block), or ("mm", hash) for a whole image run
Path = list[tuple[Key, int]]  # (key, weight in tokens)
BLOCK_TOKENS = 16  # vLLM's default KV block size


class _Node:
    __slots__ = ("children", "key", "parent", "tick", "weight")

    def __init__(self, key: Key, weight: int, parent: _Node | None) -> None:
        self.key = key
        self.weight = weight
        self.parent = parent
        self.children: dict[Key, _Node] | None = None  # None while a leaf (saves memory)
        self.tick = 0  # last time a prompt went through this node


class PrefixTree:
    """One worker's trie of prompt keys with LRU leaf eviction above ``max_nodes``."""

    def __init__(self, max_nodes: int) -> None:
        if max_nodes < 1:
            raise ValueError("max_nodes must be >= 1")
        self.max_nodes = max_nodes
        self.size = 0  # nodes below the root
        self._root = _Node(None, 0, None)
        self._tick = 0
        # Min-heap of (tick, seq, leaf); entries go stale when a leaf is touched again,
        # grows children or is evicted, and are skipped lazily.
        self._leaves: list[tuple[int, int, _Node]] = []
        self._seq = itertools.count()

    def match(self, path: Path) -> int:
        """Tokens of ``path``'s longest stored prefix. Read-only: matching is not use."""
        node, matched = self._root, 0
        for key, weight in path:
            child = node.children.get(key) if node.children else None
            if child is None:
                break
            matched += weight
            node = child
        return matched

    def insert(self, path: Path) -> None:
        self._tick += 1
        node = self._root
        for key, weight in path:
            node.tick = self._tick
            if node.children is None:
                node.children = {}
            child = node.children.get(key)
            if child is None:
                child = node.children[key] = _Node(key, weight, node)
                self.size += 1
            node = child
        node.tick = self._tick
        if node is not self._root and not node.children:
            self._push(node)
        while self.size > self.max_nodes:
            self._evict_one()
        if len(self._leaves) > 2 * self.size + 64:
            self._rebuild_heap()

    def _push(self, leaf: _Node) -> None:
        heapq.heappush(self._leaves, (leaf.tick, next(self._seq), leaf))

    def _evict_one(self) -> None:
        while self._leaves:
            tick, _, node = heapq.heappop(self._leaves)
            parent = node.parent
            if parent is None or node.children or node.tick != tick:
                continue  # stale entry
            assert parent.children is not None
            del parent.children[node.key]
            node.parent = None
            self.size -= 1
            if not parent.children and parent is not self._root:
                parent.children = None
                self._push(parent)  # keeps its own tick: its place in LRU order
            return
        self._rebuild_heap()  # unreachable while size > 0; keeps the heap honest

    def _rebuild_heap(self) -> None:
        self._leaves = []
        stack = [self._root]
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            elif node is not self._root:
                self._leaves.append((node.tick, next(self._seq), node))
        heapq.heapify(self._leaves)


def prompt_path(request: SelectionInput, block: int = BLOCK_TOKENS) -> Path:
    """Text as blocks of token ids, each media run collapsed into one key carrying its hash."""
    tokens = request.token_ids
    path: Path = []
    pos = 0
    for offset, length, mm_hash in sorted(request.media_runs):
        if length <= 0 or offset < pos or offset + length > len(tokens):
            raise ValueError(
                f"media run ({offset}, {length}) overlaps another or leaves the "
                f"{len(tokens)}-token prompt"
            )
        _add_text(path, tokens, pos, offset, block)
        path.append((("mm", mm_hash), length))
        pos = offset + length
    _add_text(path, tokens, pos, len(tokens), block)
    return path


def _add_text(path: Path, tokens: Sequence[int], start: int, end: int, block: int) -> None:
    for first in range(start, end, block):
        key = tuple(tokens[first : min(first + block, end)])
        path.append((key, len(key)))


class CacheAwarePolicy(BasePolicy):
    name = "cache_aware"

    def __init__(self, threshold: float = 0.5, max_nodes: int = 50_000) -> None:
        if not 0.0 <= threshold <= 1.0:
            raise ValueError("threshold must be within [0, 1]")
        self.threshold = threshold
        self.max_nodes = max_nodes
        self._trees: dict[str, PrefixTree] = {}
        self._next = 0  # rotates ties in the least-loaded fallback

    def select(self, workers: Sequence[Worker], request: SelectionInput) -> Worker | None:
        if not workers:
            return None
        path = prompt_path(request)
        total = sum(weight for _, weight in path)
        best, best_len = None, 0
        for worker in workers:
            tree = self._trees.get(worker.url)
            matched = tree.match(path) if tree else 0
            if matched > best_len or (
                matched == best_len and best is not None and worker.load < best.load
            ):
                best, best_len = worker, matched
        if best is None or total == 0 or best_len / total < self.threshold:
            best = self._least_loaded(workers)
        self._tree(best.url).insert(path)
        return best

    def matched_tokens(self, url: str, request: SelectionInput) -> int:
        """How many prompt tokens the policy believes ``url`` has cached (for tests/metrics)."""
        tree = self._trees.get(url)
        return tree.match(prompt_path(request)) if tree else 0

    def tree_size(self, url: str) -> int:
        tree = self._trees.get(url)
        return tree.size if tree else 0

    def remove_worker(self, url: str) -> None:
        self._trees.pop(url, None)

    def _tree(self, url: str) -> PrefixTree:
        tree = self._trees.get(url)
        if tree is None:
            tree = self._trees[url] = PrefixTree(self.max_nodes)
        return tree

    def _least_loaded(self, workers: Sequence[Worker]) -> Worker:
        lowest = min(w.load for w in workers)
        tied = [w for w in workers if w.load == lowest]
        worker = tied[self._next % len(tied)]
        self._next += 1
        return worker
