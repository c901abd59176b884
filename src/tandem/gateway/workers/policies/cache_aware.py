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
records the prompt. Trees are bounded (``max_nodes`` keys per worker) and shed their
least recently used keys first, from the ends of leaves, like the workers' own caches.

A tree keeps each run of keys that no other prompt branches from as one node (a radix
tree): a fresh prompt costs one node and is shed in one step, where a node per block
cost about 1 ms of a long prompt's routing, GC walks of 50 000 nodes included
(docs/performance.md, "Cache-aware routing's tree").
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
    """A run of keys stored as one node (a radix tree's compressed edge). Every key of a
    run was last used by the same insert (a partial use splits the run), so the run has
    one ``tick`` and the tree orders and sheds keys exactly as one node per key would."""

    __slots__ = ("children", "keys", "parent", "tick")

    def __init__(self, keys: list[Key], parent: _Node | None, tick: int) -> None:
        self.keys = keys
        self.parent = parent
        self.children: dict[Key, _Node] | None = None  # by each child's first key; None: a leaf
        self.tick = tick  # last time a prompt went through this run


class PrefixTree:
    """One worker's radix tree of prompt keys; above ``max_nodes`` keys it sheds the least
    recently used keys from the ends of its leaves. ``size`` counts keys, not runs."""

    def __init__(self, max_nodes: int) -> None:
        if max_nodes < 1:
            raise ValueError("max_nodes must be >= 1")
        self.max_nodes = max_nodes
        self.size = 0  # keys below the root
        self._root = _Node([], None, 0)
        self._tick = 0
        # Min-heap of (tick, seq, leaf); entries go stale when a leaf is touched again,
        # grows children or is shed, and are skipped lazily.
        self._leaves: list[tuple[int, int, _Node]] = []
        self._seq = itertools.count()

    def match(self, path: Path) -> int:
        """Tokens of ``path``'s longest stored prefix. Read-only: matching is not use."""
        node, matched, i, n = self._root, 0, 0, len(path)
        while i < n:
            child = node.children.get(path[i][0]) if node.children else None
            if child is None:
                break
            for key in child.keys:
                if i == n or path[i][0] != key:
                    return matched
                matched += path[i][1]
                i += 1
            node = child
        return matched

    def insert(self, path: Path) -> None:
        self._tick = tick = self._tick + 1
        node, i, n = self._root, 0, len(path)
        node.tick = tick
        while i < n:
            first = path[i][0]
            child = node.children.get(first) if node.children else None
            if child is None:  # the rest of the prompt is new: one run
                child = _Node([key for key, _ in path[i:]], node, tick)
                if node.children is None:
                    node.children = {}
                node.children[first] = child
                self.size += n - i
                node = child
                break
            keys, j, m = child.keys, 1, len(child.keys)
            i += 1
            while j < m and i < n and path[i][0] == keys[j]:
                i += 1
                j += 1
            if j < m:
                self._split(child, j)
            child.tick = tick
            node = child
        if node is not self._root and not node.children:
            self._push(node)
        if self.size > self.max_nodes:
            self._shed(self.size - self.max_nodes)
        if len(self._leaves) > 2 * self.size + 64:
            self._rebuild_heap()

    def _split(self, run: _Node, at: int) -> None:
        """Cut ``run`` after ``at`` keys; the tail keeps the run's tick and children."""
        tail = _Node(run.keys[at:], run, run.tick)
        tail.children = run.children
        if tail.children:
            for grandchild in tail.children.values():
                grandchild.parent = tail
        else:
            self._push(tail)  # the run was a leaf: its end, with its old use, still is
        del run.keys[at:]
        run.children = {tail.keys[0]: tail}

    def _push(self, leaf: _Node) -> None:
        heapq.heappush(self._leaves, (leaf.tick, next(self._seq), leaf))

    def _shed(self, excess: int) -> None:
        """Drop ``excess`` keys, the least recently used leaf's last keys first."""
        leaves = self._leaves
        while excess > 0 and leaves:
            tick, _, node = leaves[0]
            parent = node.parent
            if parent is None or node.children or node.tick != tick:
                heapq.heappop(leaves)  # stale entry
                continue
            if excess < len(node.keys):
                del node.keys[-excess:]  # still a leaf, same use: its heap entry stands
                self.size -= excess
                return
            heapq.heappop(leaves)
            assert parent.children is not None
            del parent.children[node.keys[0]]
            node.parent = None
            self.size -= len(node.keys)
            excess -= len(node.keys)
            if not parent.children and parent is not self._root:
                parent.children = None
                self._push(parent)  # keeps its own tick: its place in LRU order
        if excess > 0:
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
    span = tokens[start:end]
    whole = iter(span)
    # Full blocks, grouped in C; strict=False drops the partial tail, added next.
    path.extend([(key, block) for key in zip(*[whole] * block, strict=False)])
    if rest := len(span) % block:
        path.append((tuple(span[-rest:]), rest))


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
        total = len(request.token_ids)  # what the path's weights add up to
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
