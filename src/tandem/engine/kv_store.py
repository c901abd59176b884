"""KV that a prefill worker holds for a decode worker to pull (the PD handoff).

Every entry is held under a lease: if the decode side never pulls or releases it (the
request was aborted, the decode worker died, the gateway gave up), the entry expires
and its memory is freed. Nothing else frees it, so ``expire`` runs opportunistically on
every call that takes the lock for writing or lookup, and a periodic task of the owner
should call it too so an idle worker does not sit on stale KV.

An entry may also keep the request's media description without its pixels (the items'
hashes and ranges, the image token, the grid tensors): a decode leg that arrives with no
media of its own (SGLang's PD legs, docs/pd-contract.md) reads it to key its prefix cache
as the prefill did and to place M-RoPE positions. Pixels are never held.

Thread-safe: the compute thread stores entries while RPC threads read and release them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from tandem.engine.types import KVLayers, MediaInputs, ModelShape


class TransferNotFound(KeyError):
    """No KV is held under this transfer id (never stored, released or expired)."""

    def __str__(self) -> str:
        # KeyError's str() quotes its argument; keep the message readable.
        return str(self.args[0]) if self.args else "transfer not found"


@dataclass(slots=True)
class HeldKv:
    kv: KVLayers  # owned by the store: callers must not modify it
    token_ids: list[int]  # the ids whose KV is held (kv seq_len == len(token_ids))
    block_keys: list[bytes]  # prefix-cache keys of the full blocks, may be shorter
    expires_at: float  # in the store's clock
    num_blocks: int  # ceil(len(token_ids) / block_size): the last block may be partial
    media: MediaInputs | None = None  # pixel-free: items, image token, grids

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


def pixel_free(media: MediaInputs | None) -> MediaInputs | None:
    """``media`` without its image and video pixels (None for no media or no items)."""
    if media is None or not media.items:
        return None
    # Copies: a grid may be a view into a request's message bytes, which it would keep.
    grids = {key: np.array(value) for key, value in media.grids.items()}
    return MediaInputs(items=list(media.items), im_token_id=media.im_token_id, grids=grids)


class KvStore:
    def __init__(
        self,
        shape: ModelShape,
        lease_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        *,
        block_size: int = 16,
    ) -> None:
        if not lease_s > 0:
            raise ValueError(f"lease_s must be > 0, got {lease_s}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.shape = shape
        self.lease_s = lease_s
        self.block_size = block_size
        self._clock = clock
        self._held: dict[str, HeldKv] = {}
        self._lock = threading.Lock()
        self._stored = 0
        self._released = 0
        self._expired = 0

    # -- counters and gauges -----------------------------------------------------------

    @property
    def stored(self) -> int:
        with self._lock:
            return self._stored

    @property
    def released(self) -> int:
        with self._lock:
            return self._released

    @property
    def expired(self) -> int:
        with self._lock:
            return self._expired

    @property
    def held_count(self) -> int:
        with self._lock:
            return len(self._held)

    @property
    def held_blocks(self) -> int:
        with self._lock:
            return sum(h.num_blocks for h in self._held.values())

    @property
    def held_bytes(self) -> int:
        with self._lock:
            tokens = sum(h.num_tokens for h in self._held.values())
        return tokens * self.shape.kv_bytes_per_token

    # -- operations --------------------------------------------------------------------

    def put(
        self,
        transfer_id: str,
        kv: KVLayers,
        token_ids: Sequence[int],
        block_keys: Sequence[bytes],
        media: MediaInputs | None = None,
    ) -> None:
        """Hold ``kv`` under ``transfer_id`` until released or the lease runs out.

        The store keeps references, not copies: the caller hands ``kv`` over. ``media``
        is kept without its pixels (:func:`pixel_free`).
        """
        if not transfer_id:
            raise ValueError("transfer_id must be a non-empty string")
        self._check_kv(kv, len(token_ids))
        full_blocks = len(token_ids) // self.block_size
        if len(block_keys) > full_blocks:
            raise ValueError(
                f"{len(block_keys)} block keys for {len(token_ids)} tokens: at most "
                f"{full_blocks} full blocks of {self.block_size} have keys"
            )
        with self._lock:
            now = self._clock()
            self._expire_locked(now)
            if transfer_id in self._held:
                raise ValueError(f"transfer id {transfer_id!r} already holds KV")
            self._held[transfer_id] = HeldKv(
                kv=kv,
                token_ids=list(token_ids),
                block_keys=list(block_keys),
                expires_at=now + self.lease_s,
                num_blocks=-(-len(token_ids) // self.block_size),
                media=pixel_free(media),
            )
            self._stored += 1

    def get(self, transfer_id: str) -> HeldKv | None:
        """The held entry, or None if unknown, released or expired."""
        with self._lock:
            self._expire_locked(self._clock())
            return self._held.get(transfer_id)

    def read_blocks(self, transfer_id: str, start_block: int, end_block: int) -> KVLayers:
        """KV of blocks ``[start_block, end_block)``, as contiguous copies.

        The last block of an entry may be partial. Copies let the caller serialize them
        after the entry is released or expires. Unknown ids raise TransferNotFound.
        """
        with self._lock:
            self._expire_locked(self._clock())
            held = self._held.get(transfer_id)
            if held is None:
                raise TransferNotFound(f"no KV held for transfer id {transfer_id!r}")
            if not 0 <= start_block < end_block <= held.num_blocks:
                raise ValueError(
                    f"block range [{start_block}, {end_block}) is empty or outside "
                    f"[0, {held.num_blocks}) for transfer id {transfer_id!r}"
                )
            kv = held.kv
        lo = start_block * self.block_size
        hi = min(end_block * self.block_size, held.num_tokens)
        return [(k[:, lo:hi].contiguous(), v[:, lo:hi].contiguous()) for k, v in kv]

    def release(self, transfer_id: str) -> bool:
        """Free the entry; True if it was held. Releasing again is harmless."""
        with self._lock:
            self._expire_locked(self._clock())
            if self._held.pop(transfer_id, None) is None:
                return False
            self._released += 1
            return True

    def expire(self, now: float | None = None) -> int:
        """Drop every entry whose lease has run out by ``now``; returns how many."""
        with self._lock:
            return self._expire_locked(self._clock() if now is None else now)

    # -- internals ---------------------------------------------------------------------

    def _expire_locked(self, now: float) -> int:
        stale = [tid for tid, held in self._held.items() if held.expires_at <= now]
        for tid in stale:
            del self._held[tid]
        self._expired += len(stale)
        return len(stale)

    def _check_kv(self, kv: KVLayers, num_tokens: int) -> None:
        s = self.shape
        if len(kv) != s.num_layers:
            raise ValueError(f"kv has {len(kv)} layers, the model has {s.num_layers}")
        want = (s.num_kv_heads, num_tokens, s.head_dim)
        for layer, (k, v) in enumerate(kv):
            for name, t in (("k", k), ("v", v)):
                if tuple(t.shape) != want or t.dtype != torch.float32:
                    raise ValueError(
                        f"layer {layer} {name}: expected float32 {list(want)} "
                        f"(one position per token id), got {t.dtype} {list(t.shape)}"
                    )
