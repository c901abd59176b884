"""A block prefix cache of KV, keyed by chained block keys (see ``block_keys``).

Each block is stored as one fresh tensor ``[num_layers, 2, num_kv_heads, block_size,
head_dim]`` so a cached block never pins the (much longer) sequence tensor it came from,
and its memory cost is exactly ``block_size * shape.kv_bytes_per_token``.

Eviction is LRU by block. When a chain is used, its blocks are refreshed from the last
to the first, so the first block is the most recent: under pressure a chain loses its
tail before its head, and what remains is still a usable prefix.

Thread-safe: the compute thread and RPC threads may call in concurrently.

An optional listener (``engine/kv_events.py``) hears what was stored, evicted and
cleared, in the order it happened; without one, inserts build no event at all.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

import torch

from tandem.engine.kv_events import (
    BlockContent,
    BlockSource,
    BlocksRemoved,
    BlocksStored,
    CacheCleared,
    KvEvent,
    KvEventSink,
)
from tandem.engine.types import KVLayers, ModelShape


class PrefixCache:
    def __init__(self, shape: ModelShape, byte_budget: int, block_size: int = 16) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if byte_budget < 0:
            raise ValueError(f"byte_budget must be >= 0, got {byte_budget}")
        self.shape = shape
        self.block_size = block_size
        self.byte_budget = byte_budget
        self.block_bytes = block_size * shape.kv_bytes_per_token
        self.capacity_blocks = byte_budget // self.block_bytes if self.block_bytes else 0
        self._blocks: OrderedDict[bytes, torch.Tensor] = OrderedDict()  # LRU first
        self._lock = threading.Lock()
        self._lookups = 0
        self._query_tokens = 0
        self._hits_tokens = 0
        self._evicted_blocks = 0
        self._listener: KvEventSink | None = None

    def set_listener(self, listener: KvEventSink | None) -> None:
        """Report every later store, eviction and clear to ``listener`` (None: stop)."""
        with self._lock:
            self._listener = listener

    @property
    def enabled(self) -> bool:
        return self.capacity_blocks > 0

    # -- stats ------------------------------------------------------------------------

    @property
    def lookups(self) -> int:
        with self._lock:
            return self._lookups

    @property
    def query_tokens(self) -> int:
        """Tokens covered by the keys of all lookups (the denominator of a hit rate)."""
        with self._lock:
            return self._query_tokens

    @property
    def hits_tokens(self) -> int:
        with self._lock:
            return self._hits_tokens

    @property
    def evicted_blocks(self) -> int:
        with self._lock:
            return self._evicted_blocks

    @property
    def num_blocks(self) -> int:
        with self._lock:
            return len(self._blocks)

    @property
    def bytes_used(self) -> int:
        with self._lock:
            return len(self._blocks) * self.block_bytes

    # -- queries ----------------------------------------------------------------------

    def lookup(self, keys: Sequence[bytes]) -> int:
        """Number of leading blocks of ``keys`` that are cached; refreshes them."""
        with self._lock:
            n = self._leading(keys)
            self._lookups += 1
            self._query_tokens += len(keys) * self.block_size
            self._hits_tokens += n * self.block_size
            return n

    def get_prefix(self, keys: Sequence[bytes], n_blocks: int) -> KVLayers:
        """KV of the first ``n_blocks`` blocks of ``keys``, as fresh tensors.

        Raises KeyError when one of them is no longer cached (evicted since the lookup);
        ``match`` does lookup and fetch under one lock and cannot hit that.
        """
        if not 0 <= n_blocks <= len(keys):
            raise ValueError(f"n_blocks must be in [0, {len(keys)}], got {n_blocks}")
        with self._lock:
            missing = [i for i in range(n_blocks) if keys[i] not in self._blocks]
            if missing:
                raise KeyError(f"prefix block {missing[0]} is no longer cached")
            self._touch(keys[:n_blocks])
            blocks = [self._blocks[k] for k in keys[:n_blocks]]
        return self._assemble(blocks)

    def match(self, keys: Sequence[bytes]) -> tuple[int, KVLayers]:
        """``lookup`` and ``get_prefix`` in one step: (cached blocks, their KV)."""
        with self._lock:
            n = self._leading(keys)
            self._lookups += 1
            self._query_tokens += len(keys) * self.block_size
            self._hits_tokens += n * self.block_size
            blocks = [self._blocks[k] for k in keys[:n]]
        return n, self._assemble(blocks)

    # -- updates ----------------------------------------------------------------------

    def insert(self, keys: Sequence[bytes], kv: KVLayers, source: BlockSource | None = None) -> int:
        """Store every full block of ``kv`` that ``keys`` covers; returns blocks added.

        ``kv`` may be longer than the keys cover (e.g. a trailing partial block or
        generated tokens); only ``min(len(keys), seq_len // block_size)`` blocks count.
        ``source`` (what ``keys`` were computed from) describes the added blocks to the
        listener; without it a listener hears of evictions but not of these stores.
        """
        seq_len = self._check_kv(kv)
        n = min(len(keys), seq_len // self.block_size)
        # A chain longer than the whole cache would evict its own head; keep the head.
        n = min(n, self.capacity_blocks)
        if n == 0:
            return 0
        bs = self.block_size
        added = 0
        with self._lock:
            listener = self._listener
            describe = listener is not None and source is not None
            segments: list[tuple[int, list[BlockContent]]] = []  # (first index, blocks)
            for i in range(n):
                if keys[i] in self._blocks:
                    continue
                if describe and source is not None:
                    if not segments or segments[-1][0] + len(segments[-1][1]) != i:
                        segments.append((i, []))
                    segments[-1][1].append(source.content(i, keys[i]))
                # stack copies: the stored block shares no memory with ``kv``.
                block = torch.stack(
                    [
                        torch.stack((k[:, i * bs : (i + 1) * bs], v[:, i * bs : (i + 1) * bs]))
                        for k, v in kv
                    ]
                ).detach()
                self._blocks[keys[i]] = block
                added += 1
            self._touch(keys[:n])
            evicted: list[bytes] = []
            while len(self._blocks) > self.capacity_blocks:
                evicted.append(self._blocks.popitem(last=False)[0])
                self._evicted_blocks += 1
            if listener is not None and (segments or evicted):
                events: list[KvEvent] = [
                    BlocksStored(tuple(blocks), keys[first - 1] if first else None)
                    for first, blocks in segments
                ]
                if evicted:
                    events.append(BlocksRemoved(tuple(evicted)))
                listener.publish(events)
        return added

    def clear(self) -> None:
        with self._lock:
            self._blocks.clear()
            if self._listener is not None:
                self._listener.publish([CacheCleared()])

    # -- internals (callers hold the lock where it matters) ----------------------------

    def _leading(self, keys: Sequence[bytes]) -> int:
        n = 0
        for key in keys:
            if key not in self._blocks:
                break
            n += 1
        self._touch(keys[:n])
        return n

    def _touch(self, chain: Sequence[bytes]) -> None:
        # Last block first, so the chain's head ends up most recently used.
        for key in reversed(chain):
            self._blocks.move_to_end(key)

    def _assemble(self, blocks: list[torch.Tensor]) -> KVLayers:
        if not blocks:
            empty = torch.empty(self.shape.num_kv_heads, 0, self.shape.head_dim)
            return [(empty.clone(), empty.clone()) for _ in range(self.shape.num_layers)]
        # cat allocates: the caller may extend or modify the result without touching us.
        joined = torch.cat(blocks, dim=3)  # [layers, 2, heads, n * block_size, head_dim]
        return [(joined[layer, 0], joined[layer, 1]) for layer in range(joined.shape[0])]

    def _check_kv(self, kv: KVLayers) -> int:
        s = self.shape
        if len(kv) != s.num_layers:
            raise ValueError(f"kv has {len(kv)} layers, the model has {s.num_layers}")
        seq_len = kv[0][0].shape[1] if kv else 0
        want = (s.num_kv_heads, seq_len, s.head_dim)
        for layer, (k, v) in enumerate(kv):
            for name, t in (("k", k), ("v", v)):
                if tuple(t.shape) != want or t.dtype != torch.float32:
                    raise ValueError(
                        f"layer {layer} {name}: expected float32 {list(want)}, "
                        f"got {t.dtype} {list(t.shape)}"
                    )
        return seq_len
