"""The publisher's batches as ``smg.grpc.common`` messages, and back (for tests and tools).

The field meanings are docs/worker-protocols.md's ("KV events"): a block's hash is the
first 8 bytes of Tandem's 32-byte block key read as a signed little-endian int64; each
media item overlapping a block is one multimodal extra key (its hash, and where the
overlap starts inside the item), in position order.
"""

from __future__ import annotations

from dataclasses import dataclass

from smg_grpc_proto.generated import common_pb2 as common

from tandem.engine.kv_events import BlockContent, BlocksRemoved, BlocksStored, CacheCleared
from tandem.worker.kv_events.publisher import Batch, LoadFigures


def block_hash(key: bytes) -> int:
    return int.from_bytes(key[:8], "little", signed=True)


def to_pb(batch: Batch, load: LoadFigures, sample: int) -> common.KvEventBatch:
    out = common.KvEventBatch(sequence_number=batch.sequence, timestamp=batch.timestamp)
    for event in batch.events:
        wire = out.events.add()
        if isinstance(event, BlocksStored):
            stored = wire.stored
            stored.blocks.extend(_block(b) for b in event.blocks)
            if event.parent is not None:
                stored.parent_block_hash = block_hash(event.parent)
            salt = event.blocks[0].salt if event.blocks else None
            if salt is not None:
                stored.cache_salt = salt
            stored.tier = common.KV_CACHE_TIER_DEVICE
            stored.locality = common.KV_CACHE_LOCALITY_LOCAL
        elif isinstance(event, BlocksRemoved):
            wire.removed.block_hashes.extend(block_hash(k) for k in event.keys)
        elif isinstance(event, CacheCleared):
            wire.cleared.SetInParent()
    if batch.snapshot is not None:
        part = batch.snapshot
        out.snapshot.CopyFrom(
            common.KvSnapshotChunk(index=part.index, count=part.count, blocks=part.blocks)
        )
    out.load.CopyFrom(_load(load, sample, batch.load_only))
    return out


def _block(block: BlockContent) -> common.KvBlock:
    wire = common.KvBlock(
        block_hash=block_hash(block.key), token_ids=block.token_ids, block_size=len(block.token_ids)
    )
    for overlap in block.media:
        wire.extra_keys.add().multimodal.CopyFrom(
            common.KvMultimodalKey(identifier=overlap.mm_hash, offset=overlap.offset)
        )
    return wire


def _load(load: LoadFigures, sample: int, load_only: bool) -> common.EngineLoad:
    wire = common.EngineLoad(
        running_requests=load.running,
        waiting_requests=load.waiting,
        token_usage=load.token_usage,
        max_running_requests=load.max_running,
        age_ms=0,
        sample=sample,
        load_only=load_only,
    )
    if load.waiting_uncached_tokens is not None:
        wire.waiting_uncached_tokens = load.waiting_uncached_tokens
    return wire


@dataclass(frozen=True, slots=True)
class WireBlock:
    """A block as a subscriber learns it from the stream."""

    token_ids: tuple[int, ...]
    media: tuple[tuple[str, int], ...]  # (identifier, offset) per multimodal extra key
    salt: str | None
    parent: int | None


def apply_pb(state: dict[int, WireBlock], batch: common.KvEventBatch) -> None:
    """Apply one received batch to ``state`` (block hash -> block), as a subscriber would."""
    for event in batch.events:
        kind = event.WhichOneof("data")
        if kind == "stored":
            stored = event.stored
            parent = stored.parent_block_hash if stored.HasField("parent_block_hash") else None
            salt = stored.cache_salt if stored.HasField("cache_salt") else None
            for block in stored.blocks:
                media = tuple(
                    (k.multimodal.identifier, k.multimodal.offset) for k in block.extra_keys
                )
                state[block.block_hash] = WireBlock(tuple(block.token_ids), media, salt, parent)
                parent = block.block_hash
        elif kind == "removed":
            for h in event.removed.block_hashes:
                state.pop(h, None)
        elif kind == "cleared":
            state.clear()
