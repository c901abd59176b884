"""The embedding side channel (E/P/D): how a prefill worker pulls an image's features from
the encode worker that computed them.

It is a small gRPC service of Tandem's own, ``tandem.kv.EmbeddingTransfer``, added to the
encode worker's server beside the KV side channel (``kv_channel.py``): JSON requests,
raw frames (``embedding_frames.py``), no .proto, since both ends are Tandem.

- ``Pull {"transfer_id", "wait_s"}``: the features held under the transfer id, as a
  stream of frames; the entry is taken (one prefill per transfer). When it is not there
  yet (the encode is still running) the server waits up to ``wait_s`` (at most
  ``MAX_WAIT_S``) for it, then answers NOT_FOUND with the id in the message. When the
  encode failed (:meth:`EmbeddingStore.fail`) it answers FAILED_PRECONDITION with the
  encoder's message at once, so the prefill does not wait out its timeout.

The store holds each entry under a lease: a prefill that never comes does not keep its
features forever. Expired entries are dropped on every call and by ``expire``, which the
owner should also call periodically (as ``worker/server.py`` does for the KV store).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from tandem.engine.types import ImageFeatures
from tandem.wire.peer_channels import PeerChannels, once_more_when_unavailable
from tandem.worker.embedding_frames import (
    CHUNK_BYTES,
    FeaturesReader,
    PulledEmbedding,
    encode_features,
)

__all__ = [
    "MAX_WAIT_S",
    "SERVICE",
    "EmbeddingChannelServer",
    "EmbeddingClient",
    "EmbeddingFailed",
    "EmbeddingNotFound",
    "EmbeddingStore",
    "HeldEmbedding",
    "PulledEmbedding",
]

SERVICE = "tandem.kv.EmbeddingTransfer"
MAX_WAIT_S = 60.0  # the longest a Pull waits for its transfer id


class EmbeddingNotFound(LookupError):
    """Nothing was held under the transfer id within the wait (not yet, taken or expired)."""


class EmbeddingFailed(RuntimeError):
    """The encode for the transfer id failed; the message is the encoder's."""


@dataclass(slots=True)
class HeldEmbedding:
    digest: str
    features: ImageFeatures | None  # None: the encode failed
    error: str | None
    expires_at: float  # in the store's clock


class EmbeddingStore:
    """Features held by transfer id until a prefill takes them or the lease runs out.

    Thread-safe: an encode may finish on another thread than the one serving pulls;
    waiters are woken on their own event loops.
    """

    def __init__(self, lease_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        if not lease_s > 0:
            raise ValueError(f"lease_s must be > 0, got {lease_s}")
        self.lease_s = lease_s
        self._clock = clock
        self._lock = threading.Lock()
        self._held: dict[str, HeldEmbedding] = {}
        self._waiters: dict[str, list[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}
        self._counts = {"stored": 0, "taken": 0, "expired": 0, "failed": 0}

    def counters(self) -> dict[str, int]:
        """``held`` (entries now, failures included), ``stored`` (put), ``taken`` (pulled),
        ``expired`` (lease ran out), ``failed`` (fail)."""
        with self._lock:
            self._expire_locked(self._clock())
            return {"held": len(self._held), **self._counts}

    @property
    def held(self) -> int:
        return self.counters()["held"]

    def put(self, transfer_id: str, digest: str, features: ImageFeatures) -> None:
        """Hold ``features`` (by reference) for the prefill that will pull ``transfer_id``."""
        self._hold(transfer_id, HeldEmbedding(digest, features, None, 0.0))

    def fail(self, transfer_id: str, message: str) -> None:
        """The encode for ``transfer_id`` failed: its puller gets ``message`` at once."""
        self._hold(transfer_id, HeldEmbedding("", None, message, 0.0))

    def _hold(self, transfer_id: str, entry: HeldEmbedding) -> None:
        if not transfer_id:
            raise ValueError("transfer_id must be a non-empty string")
        with self._lock:
            now = self._clock()
            self._expire_locked(now)
            if transfer_id in self._held:
                raise ValueError(f"transfer id {transfer_id!r} already holds an embedding")
            entry.expires_at = now + self.lease_s
            self._held[transfer_id] = entry
            self._counts["failed" if entry.features is None else "stored"] += 1
            waiters = self._waiters.pop(transfer_id, [])
        for loop, event in waiters:
            # A closed loop refuses the call: nobody is waiting there any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(event.set)

    async def wait_take(self, transfer_id: str, wait_s: float) -> HeldEmbedding:
        """The entry under ``transfer_id``, removed; waits up to ``wait_s`` for it.

        Raises EmbeddingNotFound after the wait, EmbeddingFailed for a failed encode
        (taken too: it is answered once).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(wait_s, 0.0)
        while True:
            event = asyncio.Event()
            waiter = (loop, event)
            with self._lock:
                self._expire_locked(self._clock())
                entry = self._held.pop(transfer_id, None)
                if entry is None:
                    self._waiters.setdefault(transfer_id, []).append(waiter)
                elif entry.features is not None:
                    self._counts["taken"] += 1
            if entry is not None:
                if entry.features is None:
                    raise EmbeddingFailed(entry.error or "the encode failed")
                return entry
            try:
                await asyncio.wait_for(event.wait(), max(deadline - loop.time(), 0.0))
            except TimeoutError:
                raise EmbeddingNotFound(
                    f"no embedding held under transfer id {transfer_id!r} after "
                    f"{max(wait_s, 0.0):g}s (not encoded yet, already taken, or expired)"
                ) from None
            finally:
                self._forget(transfer_id, waiter)

    def expire(self, now: float | None = None) -> int:
        """Drop every entry whose lease has run out by ``now``; returns how many."""
        with self._lock:
            return self._expire_locked(self._clock() if now is None else now)

    def _forget(self, transfer_id: str, waiter: tuple[asyncio.AbstractEventLoop, Any]) -> None:
        with self._lock:
            waiters = self._waiters.get(transfer_id)
            if waiters and waiter in waiters:
                waiters.remove(waiter)
                if not waiters:
                    del self._waiters[transfer_id]

    def _expire_locked(self, now: float) -> int:
        stale = [tid for tid, entry in self._held.items() if entry.expires_at <= now]
        for tid in stale:
            del self._held[tid]
        self._counts["expired"] += len(stale)
        return len(stale)


def _loads(data: bytes) -> dict[str, Any]:
    value = json.loads(data.decode())
    return value if isinstance(value, dict) else {}


def _dumps(value: dict[str, Any]) -> bytes:
    return json.dumps(value).encode()


def _identity(data: bytes) -> bytes:
    return data


def _seconds(value: Any) -> float:
    """A JSON ``wait_s`` as seconds: 0 for anything not a number > 0, capped."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        return 0.0
    return min(float(value), MAX_WAIT_S)


class EmbeddingChannelServer:
    """Serves one encode worker's :class:`EmbeddingStore`."""

    def __init__(self, store: EmbeddingStore, chunk_bytes: int = CHUNK_BYTES) -> None:
        self.store = store
        self.chunk_bytes = chunk_bytes

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "Pull": grpc.unary_stream_rpc_method_handler(
                    self.pull, request_deserializer=_loads, response_serializer=_identity
                ),
            },
        )

    async def pull(
        self, request: dict[str, Any], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        transfer_id = request.get("transfer_id")
        if not isinstance(transfer_id, str) or not transfer_id:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "Pull needs a non-empty transfer_id string"
            )
            return
        try:
            held = await self.store.wait_take(transfer_id, _seconds(request.get("wait_s")))
        except EmbeddingNotFound as error:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(error))
            return
        except EmbeddingFailed as error:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"the encode for transfer id {transfer_id!r} failed: {error}",
            )
            return
        assert held.features is not None  # wait_take raised for a failed encode
        for frame in encode_features(held.digest, held.features, self.chunk_bytes):
            yield frame


class EmbeddingClient:
    """Pulls features from encode workers; one channel per address, reused.

    gRPC errors reach the caller as ``grpc.aio.AioRpcError`` (NOT_FOUND,
    FAILED_PRECONDITION, UNAVAILABLE, DEADLINE_EXCEEDED …); frames that do not form
    features raise ``EmbeddingFrameError`` (a ValueError).
    """

    def __init__(self, timeout_s: float = 30.0) -> None:
        self.timeout_s = timeout_s
        self._peers = PeerChannels()

    async def pull(self, address: str, transfer_id: str, wait_s: float) -> PulledEmbedding:
        channel = self._peers.get(address)
        call = channel.unary_stream(
            f"/{SERVICE}/Pull", request_serializer=_dumps, response_deserializer=_identity
        )
        request = {"transfer_id": transfer_id, "wait_s": wait_s}

        async def attempt() -> PulledEmbedding:
            reader = FeaturesReader()
            timeout = self.timeout_s + max(wait_s, 0.0)
            stream: AsyncIterator[bytes] = call(request, timeout=timeout)
            async for frame in stream:
                reader.feed(frame)
            return reader.result()

        return await once_more_when_unavailable(channel, attempt)

    async def close(self) -> None:
        await self._peers.close()
