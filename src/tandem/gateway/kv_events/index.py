"""Which worker holds which KV block, as the workers' own events say.

Per worker: the worker's int64 ``block_hash`` → the gateway's content key (``keys.py``),
so a ``KvBlocksStored`` child is keyed from its ``parent_block_hash`` and a
``KvBlocksRemoved`` finds what to drop. Across workers: content key → the workers holding
it, which answers a request's query (leading blocks held, per worker) in one walk of its
key chain. A stored event whose parent the index does not know (it joined late, or
dropped the parent at its cap) cannot be keyed: its blocks are dropped and counted.

Memory is bounded by ``max_blocks`` per worker, oldest stored first out. The default,
131 072 blocks (2 M tokens at 16 per block), is more than the whole KV of a large GPU
(an 8 B model on 140 GB holds about 1 M tokens), so a healthy worker never reaches it;
at about 200 bytes per block (two dict entries, a 16-byte key) it is ~25 MB per worker.
A block dropped at the cap only shortens matches (the walk stops there): never stale.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from smg_grpc_proto.generated import common_pb2 as common

from tandem.gateway.kv_events.keys import DEFAULT_BLOCK_SIZE, ContentKey, block_key, root_key

DEFAULT_MAX_BLOCKS = 131_072
_REMOTE = common.KV_CACHE_LOCALITY_REMOTE


@dataclass(slots=True)
class WorkerBlocks:
    """One worker's view: its hashes in insertion order (the dict keeps it)."""

    by_hash: dict[int, ContentKey] = field(default_factory=dict)
    copies: dict[ContentKey, int] = field(default_factory=dict)  # a key under >1 hash
    block_size: int = DEFAULT_BLOCK_SIZE


@dataclass(slots=True)
class ApplyResult:
    """What one batch did, for the metrics."""

    events: int = 0
    stored: int = 0
    removed: int = 0
    dropped: int = 0  # blocks of stored events with an unknown parent
    cleared: bool = False


class KvEventIndex:
    def __init__(self, max_blocks: int = DEFAULT_MAX_BLOCKS) -> None:
        if max_blocks < 1:
            raise ValueError("max_blocks must be >= 1")
        self.max_blocks = max_blocks
        self._workers: dict[str, WorkerBlocks] = {}
        self._holders: dict[ContentKey, set[str]] = {}

    # -- updates ---------------------------------------------------------------------

    def apply(self, url: str, events: Iterable[common.KvCacheEvent]) -> ApplyResult:
        result = ApplyResult()
        for event in events:
            result.events += 1
            kind = event.WhichOneof("data")
            if kind == "stored":
                self._store(url, event.stored, result)
            elif kind == "removed":
                for block_hash in event.removed.block_hashes:
                    result.removed += self._remove(url, block_hash)
            elif kind == "cleared":
                self.drop_worker(url)
                self._workers[url] = WorkerBlocks()
                result.cleared = True
        return result

    def drop_worker(self, url: str) -> None:
        """Forget everything ``url`` holds (it left, or its stream lost events)."""
        blocks = self._workers.pop(url, None)
        if blocks is None:
            return
        for key in blocks.copies:
            self._release_holder(key, url)

    def _store(self, url: str, stored: common.KvBlocksStored, result: ApplyResult) -> None:
        if stored.HasField("locality") and stored.locality == _REMOTE:
            return  # a shared pool's blocks: not this worker's prefix cache
        blocks = self._workers.setdefault(url, WorkerBlocks())
        if stored.blocks and stored.blocks[0].block_size > 0:
            blocks.block_size = stored.blocks[0].block_size
        if stored.HasField("parent_block_hash"):
            parent = blocks.by_hash.get(stored.parent_block_hash)
            if parent is None:
                result.dropped += len(stored.blocks)
                return
        else:
            parent = root_key(blocks.block_size)
        salt = stored.cache_salt if stored.HasField("cache_salt") else None
        lora = stored.lora_name if stored.HasField("lora_name") else None
        for block in stored.blocks:
            ids = [
                extra.multimodal.identifier
                for extra in block.extra_keys
                if extra.WhichOneof("key") == "multimodal"
            ]
            key = block_key(parent, salt, lora, block.token_ids, ids)
            self._add(url, blocks, block.block_hash, key)
            result.stored += 1
            parent = key
        while len(blocks.by_hash) > self.max_blocks:
            self._remove(url, next(iter(blocks.by_hash)))

    def _add(self, url: str, blocks: WorkerBlocks, block_hash: int, key: ContentKey) -> None:
        old = blocks.by_hash.pop(block_hash, None)
        if old is not None:  # re-stored under the same hash: the newer content wins
            self._drop_copy(url, blocks, old)
        blocks.by_hash[block_hash] = key
        blocks.copies[key] = blocks.copies.get(key, 0) + 1
        self._holders.setdefault(key, set()).add(url)

    def _remove(self, url: str, block_hash: int) -> int:
        blocks = self._workers.get(url)
        key = blocks.by_hash.pop(block_hash, None) if blocks else None
        if blocks is None or key is None:
            return 0
        self._drop_copy(url, blocks, key)
        return 1

    def _drop_copy(self, url: str, blocks: WorkerBlocks, key: ContentKey) -> None:
        left = blocks.copies[key] - 1
        if left:
            blocks.copies[key] = left
            return
        del blocks.copies[key]
        self._release_holder(key, url)

    def _release_holder(self, key: ContentKey, url: str) -> None:
        holders = self._holders.get(key)
        if holders is not None:
            holders.discard(url)
            if not holders:
                del self._holders[key]

    # -- queries ---------------------------------------------------------------------

    def known(self, url: str) -> bool:
        return url in self._workers

    def block_size(self, url: str) -> int:
        blocks = self._workers.get(url)
        return blocks.block_size if blocks else DEFAULT_BLOCK_SIZE

    def blocks(self, url: str) -> int:
        blocks = self._workers.get(url)
        return len(blocks.by_hash) if blocks else 0

    def holders(self, key: ContentKey) -> frozenset[str]:
        return frozenset(self._holders.get(key, ()))

    def leading_blocks(self, keys: Sequence[ContentKey], urls: Iterable[str]) -> dict[str, int]:
        """For each of ``urls``: how many of ``keys``' leading blocks it holds."""
        result = dict.fromkeys(urls, 0)
        alive = set(result)
        for depth, key in enumerate(keys):
            alive &= self._holders.get(key, set())
            if not alive:
                break
            for url in alive:
                result[url] = depth + 1
        return result
