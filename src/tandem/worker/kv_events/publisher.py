"""The worker's KV-event publisher: what its prefix cache holds, as numbered batches.

One per worker process (``worker/server.py``), shared by whichever protocol it serves and
protocol-neutral: ``convert.py`` turns its batches into ``smg.grpc.common`` messages and
``stream.py`` serves them over ``SubscribeKvEvents``. The contract is docs/worker-protocols.md
("KV events", issue 36).

Threads: the engine's compute thread calls :meth:`publish` (the cache's listener, under the
cache lock); it only hands the events to the event loop with ``call_soon_threadsafe`` and
returns, so a slow subscriber can never slow the engine. Everything else (sequence numbers,
the live-block map, the history, the subscribers' queues, heartbeats) lives on the loop,
touched by the loop alone: no lock, and the order of batches is the order of the changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tandem.engine.kv_events import (
    BlockContent,
    BlocksRemoved,
    BlocksStored,
    CacheCleared,
    KvEvent,
)

log = logging.getLogger("tandem.worker")

HISTORY_BATCHES = 4096  # batches kept for a reconnecting subscriber's replay
QUEUE_LIMIT = 1024  # batches a subscriber may fall behind before its stream is ended
SNAPSHOT_CHUNK_BLOCKS = 512


@dataclass(frozen=True, slots=True)
class LoadFigures:
    """The engine's load as a batch's ``EngineLoad`` carries it."""

    running: int
    waiting: int
    waiting_uncached_tokens: int | None  # None: the engine cannot tell
    token_usage: float  # prefix-cache bytes used over its byte budget (0 with no budget)
    max_running: int  # 0: no admission window


@dataclass(frozen=True, slots=True)
class SnapshotPart:
    index: int
    count: int
    blocks: int


@dataclass(frozen=True, slots=True)
class Batch:
    sequence: int
    timestamp: float
    events: tuple[KvEvent, ...] = ()
    snapshot: SnapshotPart | None = None
    load_only: bool = False


@dataclass(slots=True)
class _Live:
    content: BlockContent
    parent: bytes | None


class SubscriberTooSlow(Exception):
    """The subscriber's queue overflowed: its stream ends (RESOURCE_EXHAUSTED)."""


@dataclass(eq=False, slots=True)
class Subscriber:
    limit: int
    early_load: bool  # load_records_before_first_batch
    queue: asyncio.Queue[Batch | None] = field(default_factory=asyncio.Queue)
    overflowed: bool = False

    def offer(self, batch: Batch) -> None:
        if self.overflowed:
            return
        if self.queue.qsize() >= self.limit:
            # Drop what it has not read and wake it with the end marker at once.
            self.overflowed = True
            while not self.queue.empty():
                self.queue.get_nowait()
            self.queue.put_nowait(None)
            return
        self.queue.put_nowait(batch)

    async def next(self) -> Batch:
        batch = await self.queue.get()
        if batch is None:
            raise SubscriberTooSlow(f"fell more than {self.limit} batches behind")
        return batch


class KvEventPublisher:
    def __init__(
        self,
        load: Callable[[], LoadFigures],
        heartbeat_s: float = 1.0,
        *,
        history: int = HISTORY_BATCHES,
        queue_limit: int = QUEUE_LIMIT,
        chunk_blocks: int = SNAPSHOT_CHUNK_BLOCKS,
    ) -> None:
        if heartbeat_s <= 0:
            raise ValueError("heartbeat_s must be positive")
        self._load = load
        self.heartbeat_s = heartbeat_s
        self.queue_limit = queue_limit
        self.chunk_blocks = chunk_blocks
        self.sequence = 0
        self._history: deque[Batch] = deque(maxlen=history)
        self._live: OrderedDict[bytes, _Live] = OrderedDict()  # insertion order: parents first
        self._subscribers: set[Subscriber] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._last_load: LoadFigures | None = None
        self._last_sent = 0.0

    # -- lifecycle (loop thread) ---------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._ticker = loop.create_task(self._heartbeats())

    async def stop(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        self._loop = None

    # -- from the engine (any thread) ------------------------------------------------------

    def publish(self, events: Sequence[KvEvent]) -> None:
        loop = self._loop
        if loop is None:  # not started (or stopped): nobody can subscribe, keep the state
            self._apply(tuple(events), time.time())
            return
        with contextlib.suppress(RuntimeError):  # the loop closed under a stopping worker
            loop.call_soon_threadsafe(self._apply, tuple(events), time.time())

    # -- state (loop thread) ------------------------------------------------------------------

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    @property
    def live_blocks(self) -> int:
        return len(self._live)

    def load(self) -> LoadFigures:
        return self._load()

    def _apply(self, events: tuple[KvEvent, ...], timestamp: float) -> None:
        kept: list[KvEvent] = []
        for event in events:
            if isinstance(event, BlocksStored):
                parent = event.parent
                for block in event.blocks:
                    self._live[block.key] = _Live(block, parent)
                    parent = block.key
                kept.append(event)
            elif isinstance(event, BlocksRemoved):
                # Only blocks this stream announced are announced gone.
                gone = tuple(k for k in event.keys if self._live.pop(k, None) is not None)
                if gone:
                    kept.append(BlocksRemoved(gone))
            elif isinstance(event, CacheCleared):
                self._live.clear()
                kept.append(event)
        if not kept:
            return
        self.sequence += 1
        batch = Batch(self.sequence, timestamp, tuple(kept))
        self._history.append(batch)
        self._fan_out(batch)

    def _fan_out(self, batch: Batch) -> None:
        self._last_sent = time.monotonic()
        for subscriber in list(self._subscribers):
            subscriber.offer(batch)

    # -- subscriptions (loop thread) ------------------------------------------------------------

    def subscribe(self, start: int, early_load: bool) -> tuple[Subscriber, list[Batch]]:
        """A new subscriber and what it gets before the live batches: a replay or a snapshot.

        Registered in the same step as the replay is taken, so nothing falls between them.
        """
        subscriber = Subscriber(self.queue_limit, early_load)
        oldest = self._history[0].sequence if self._history else self.sequence + 1
        if start == 0 or start < oldest or start > self.sequence + 1:
            first = self.snapshot()
        else:
            first = [b for b in self._history if b.sequence >= start]
        self._subscribers.add(subscriber)
        return subscriber, first

    def unsubscribe(self, subscriber: Subscriber) -> None:
        self._subscribers.discard(subscriber)

    def snapshot(self) -> list[Batch]:
        """The live blocks as chunks numbered up to the current sequence, parents first."""
        flat = list(self._live.values())
        now = time.time()
        count = 1 if not flat else min(math.ceil(len(flat) / self.chunk_blocks), self.sequence + 1)
        size = math.ceil(len(flat) / count) if flat else 0
        chunks = []
        for index in range(count):
            events: list[KvEvent] = [CacheCleared()] if index == 0 else []
            events.extend(_segments(flat[index * size : (index + 1) * size]))
            part = SnapshotPart(index, count, len(flat))
            chunks.append(Batch(self.sequence - count + 1 + index, now, tuple(events), part))
        return chunks

    # -- heartbeats (loop thread) -----------------------------------------------------------------

    async def _heartbeats(self) -> None:
        tick = min(self.heartbeat_s, 0.05)  # how soon a load change goes out (coalesced)
        while True:
            await asyncio.sleep(tick)
            try:
                self._heartbeat()
            except Exception:  # a failed load read must not end the heartbeats
                log.exception("KV-event heartbeat failed")

    def _heartbeat(self) -> None:
        load = self._load()
        due = time.monotonic() - self._last_sent >= self.heartbeat_s
        if load == self._last_load and not due:
            return
        self._last_load = load
        self._last_sent = time.monotonic()
        beat = Batch(self.sequence, time.time(), load_only=True)
        for subscriber in list(self._subscribers):
            # Before the first batch, only a subscriber that asked takes records numbered 0.
            if self.sequence or subscriber.early_load:
                subscriber.offer(beat)


def _segments(blocks: list[_Live]) -> list[BlocksStored]:
    """Consecutive runs of one chain (each block's parent the one before) as stored events."""
    out: list[BlocksStored] = []
    run: list[BlockContent] = []
    parent: bytes | None = None
    for live in blocks:
        if run and live.parent == run[-1].key and live.content.salt == run[-1].salt:
            run.append(live.content)
            continue
        if run:
            out.append(BlocksStored(tuple(run), parent))
        run, parent = [live.content], live.parent
    if run:
        out.append(BlocksStored(tuple(run), parent))
    return out
