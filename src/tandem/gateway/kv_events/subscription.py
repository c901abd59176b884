"""One worker's ``SubscribeKvEvents`` stream, kept open and applied to the index.

States: *live* (the index holds exactly what the worker's events said, snapshot
included), *syncing* (connected, the snapshot not finished), *down* (between streams)
and *no events* (the worker answered UNIMPLEMENTED). The policy reads the index only for
a live worker; every other state is routed by the fallback.

- Resync: on a sequence gap (a batch that is not cursor + 1, or a heartbeat naming a
  later sequence than the cursor) and on every reconnect, the worker's entries are
  dropped at once and the subscription asks again. It asks from 0, not cursor + 1: the
  entries are gone, so only a snapshot rebuilds them, and a worker restarted on its
  address may have numbered past the old cursor already (a replay of its new life from
  there would leave out its first batches). Snapshot chunk 0's ``KvCacheCleared``
  resets the worker; the last chunk makes it live.
- A stream with no snapshot (smg's relay in front of vLLM or SGLang streams live only,
  each data-parallel rank numbered on its own) is live from its first batch, wherever its
  numbering stands, with one cursor per ``dp_rank``. What the worker held before the
  stream began stays unknown to the index: those blocks never match, so routing can only
  under-estimate a worker's cache, never send a request to blocks it does not hold.
- Back-off between failed connects: 0.1 s, doubling, capped at 2 s (under the health
  interval, 5 s by default, so a returning worker is live again within about one check),
  reset once a stream has delivered a batch. A gap is retried at once.
- UNIMPLEMENTED: no events; asked again every 60 s (a worker upgraded in place).
- The latest ``EngineLoad`` and its receive time (monotonic) are kept per stream;
  :meth:`fresh_load` answers it while younger than two heartbeats.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Literal

import grpc
from smg_grpc_proto.generated import common_pb2 as common

from tandem.gateway import metrics
from tandem.gateway.kv_events.index import KvEventIndex

log = logging.getLogger("tandem.gateway.kv_events")

State = Literal["down", "syncing", "live", "no_events", "stopped"]
Opener = Callable[[int], AsyncIterator[common.KvEventBatch]]

BACKOFF_INITIAL_S = 0.1
BACKOFF_MAX_S = 2.0
NO_EVENTS_RETRY_S = 60.0
HEARTBEAT_S = 1.0  # the workers' --kv-events-heartbeat-secs default


class SequenceGap(Exception):
    """The stream skipped batches: the index no longer matches the worker."""


@dataclass(frozen=True, slots=True)
class ReceivedLoad:
    load: common.EngineLoad
    received: float  # time.monotonic() when its batch arrived


class KvEventSubscription:
    def __init__(
        self,
        url: str,
        open_stream: Opener,
        index: KvEventIndex,
        *,
        heartbeat_s: float = HEARTBEAT_S,
        backoff_initial_s: float = BACKOFF_INITIAL_S,
        backoff_max_s: float = BACKOFF_MAX_S,
        no_events_retry_s: float = NO_EVENTS_RETRY_S,
    ) -> None:
        self.url = url
        self.index = index
        self.heartbeat_s = heartbeat_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.no_events_retry_s = no_events_retry_s
        self.state: State = "down"
        self.cursors: dict[int, int] = {}  # dp_rank -> the last sequence number applied
        self.resyncs = 0
        self.connects = 0
        self._open = open_stream
        self._load: ReceivedLoad | None = None
        self._delivered = False
        self._task: asyncio.Task[None] | None = None

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    def cancel(self) -> None:
        """Stop now (synchronously: the entries go before the caller returns)."""
        if self._task is not None:
            self._task.cancel()
        self._go_down("stopped")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.state != "stopped":  # after cancel(): another subscription may own the url now
            self._go_down("stopped")

    # -- what the policy reads -------------------------------------------------------

    @property
    def live(self) -> bool:
        return self.state == "live"

    @property
    def cursor(self) -> int:
        """Rank 0's cursor (a Tandem worker has that rank alone)."""
        return self.cursors.get(0, 0)

    def fresh_load(self, now: float | None = None) -> common.EngineLoad | None:
        """The latest EngineLoad if it is less than two heartbeats old, else None."""
        record = self._load
        if record is None:
            return None
        age = (time.monotonic() if now is None else now) - record.received
        return record.load if age < 2 * self.heartbeat_s else None

    # -- the loop --------------------------------------------------------------------

    async def _run(self) -> None:
        backoff = self.backoff_initial_s
        while True:
            self._delivered = False
            try:
                await self._stream_once()
            except SequenceGap as gap:
                log.warning("kv events of %s: %s; resyncing", self.url, gap)
                self._resync()
                continue  # at once: the worker is up
            except grpc.aio.AioRpcError as err:
                if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                    if self.state != "no_events":
                        log.info("worker %s publishes no kv events", self.url)
                    self._go_down("no_events")
                    await asyncio.sleep(self.no_events_retry_s)
                    continue
                log.debug("kv events of %s ended: %s", self.url, err.code().name)
            except Exception:  # a malformed batch: treat like a lost stream, never crash
                log.exception("kv events of %s failed", self.url)
            # Lost the stream (ended, failed, worker gone): entries go at once.
            if self.state in ("live", "syncing"):
                self._resync()
            else:
                self._go_down("down")
            if self._delivered:
                backoff = self.backoff_initial_s
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.backoff_max_s)

    async def _stream_once(self) -> None:
        """Read one stream to its end (``_delivered``: it brought at least one batch)."""
        self.connects += 1
        stream = self._open(0)
        try:
            async for batch in stream:
                self._delivered = True
                self._handle(batch)
        finally:
            cancel = getattr(stream, "cancel", None)
            if cancel is not None:
                cancel()  # a gap leaves the call open otherwise

    def _handle(self, batch: common.KvEventBatch) -> None:
        if batch.HasField("load"):
            self._load = ReceivedLoad(batch.load, time.monotonic())
        if self.state in ("down", "no_events"):
            self.state = "syncing"
        seq, rank = batch.sequence_number, batch.dp_rank
        cursor = self.cursors.get(rank)
        if batch.HasField("load") and batch.load.load_only and not batch.events:
            # A heartbeat repeats the last sequence sent: a later one means we missed some.
            if self.state == "live" and cursor is not None and seq > cursor:
                raise SequenceGap(f"heartbeat at {seq} after {cursor} (rank {rank})")
            return
        if batch.HasField("snapshot"):
            self._snapshot_chunk(batch)
            return
        # Without a snapshot a rank's first batch starts its numbering (see the module doc).
        if self.state != "syncing" and cursor is not None and seq != cursor + 1:
            raise SequenceGap(f"batch {seq} after {cursor} (rank {rank})")
        self._apply(batch)
        self.cursors[rank] = seq
        self.state = "live"

    def _snapshot_chunk(self, batch: common.KvEventBatch) -> None:
        chunk = batch.snapshot
        seq = batch.sequence_number
        if chunk.index == 0:
            first = batch.events[0].WhichOneof("data") if batch.events else None
            if first != "cleared":
                raise SequenceGap("snapshot chunk 0 does not begin with KvCacheCleared")
            self.state = "syncing"
        elif self.state != "syncing" or seq != self.cursor + 1:
            raise SequenceGap(f"snapshot chunk {chunk.index} at {seq} after {self.cursor}")
        self._apply(batch)
        self.cursors[batch.dp_rank] = seq
        if chunk.index + 1 >= chunk.count:
            self.state = "live"
            log.info(
                "kv events of %s live at %d: %d blocks", self.url, seq, self.index.blocks(self.url)
            )

    def _apply(self, batch: common.KvEventBatch) -> None:
        result = self.index.apply(self.url, batch.events)
        metrics.KV_EVENTS_APPLIED.labels(self.url).inc(result.events)
        if result.dropped:
            metrics.KV_EVENT_DROPPED_BLOCKS.labels(self.url).inc(result.dropped)
        metrics.KV_EVENT_BLOCKS.labels(self.url).set(self.index.blocks(self.url))

    def _resync(self) -> None:
        self.resyncs += 1
        metrics.KV_EVENT_RESYNCS.labels(self.url).inc()
        self._go_down("down")

    def _go_down(self, state: State) -> None:
        self.state = state
        self.cursors.clear()
        self.index.drop_worker(self.url)
        metrics.KV_EVENT_BLOCKS.labels(self.url).set(0)
