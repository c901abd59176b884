"""One KV-event subscription per registered worker, following the registry and health.

A worker added to the registry gets a subscription (if its protocol has the RPC: MLX has
none, so it is routed by the fallback); a worker removed, or marked unhealthy by the
health checker, has its subscription stopped and its entries dropped at once, so no
request is routed by stale entries longer than one health interval (the health checker
flips the flag; the watch below sees it within ``watch_s``). A worker healthy again is
subscribed again, from a snapshot. Only the gateway state starts it, and only when a
``kv_events`` policy is in use (``gateway/state.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from smg_grpc_proto.generated import common_pb2 as common

from tandem.gateway import metrics
from tandem.gateway.kv_events.index import DEFAULT_MAX_BLOCKS, KvEventIndex
from tandem.gateway.kv_events.subscription import HEARTBEAT_S, KvEventSubscription
from tandem.gateway.workers.registry import WorkerEvent, WorkerRegistry
from tandem.gateway.workers.worker import Worker

log = logging.getLogger("tandem.gateway.kv_events")

WATCH_S = 0.25  # how often health flags are compared: well under a health interval


class KvEventManager:
    def __init__(
        self,
        registry: WorkerRegistry,
        *,
        max_blocks: int = DEFAULT_MAX_BLOCKS,
        heartbeat_s: float = HEARTBEAT_S,
        watch_s: float = WATCH_S,
        **subscription_options: Any,
    ) -> None:
        self.registry = registry
        self.index = KvEventIndex(max_blocks)
        self.heartbeat_s = heartbeat_s
        self.watch_s = watch_s
        self._options = subscription_options  # back-off figures (tests shorten them)
        self._subs: dict[str, KvEventSubscription] = {}
        self._watch: asyncio.Task[None] | None = None
        self._ending: set[asyncio.Task[None]] = set()  # stopped subscriptions winding down
        registry.on_change(self._on_change)

    # -- what the policy reads -------------------------------------------------------

    def live(self, url: str) -> bool:
        sub = self._subs.get(url)
        return sub is not None and sub.live

    def fresh_load(self, url: str) -> common.EngineLoad | None:
        sub = self._subs.get(url)
        return sub.fresh_load() if sub is not None else None

    def subscription(self, url: str) -> KvEventSubscription | None:
        return self._subs.get(url)

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        """Subscribe to every healthy worker and keep following the registry."""
        self._reconcile()
        if self._watch is None or self._watch.done():
            self._watch = asyncio.get_running_loop().create_task(self._watch_health())

    async def stop(self) -> None:
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
        subs = list(self._subs.values())
        self._subs.clear()
        await asyncio.gather(*(sub.stop() for sub in subs), *self._ending, return_exceptions=True)

    def _on_change(self, event: WorkerEvent, worker: Worker) -> None:
        if self._watch is None:
            return  # not started (or stopped): start() subscribes to who is there
        if event == "added":
            self._reconcile()
        else:
            self._unsubscribe(worker.url)
            for series in metrics.KV_EVENT_SERIES:  # label cardinality = workers
                with contextlib.suppress(KeyError):
                    series.remove(worker.url)

    async def _watch_health(self) -> None:
        while True:
            await asyncio.sleep(self.watch_s)
            try:
                self._reconcile()
            except Exception:  # keep watching; one bad round must not end the loop
                log.exception("kv events watch round failed")

    def _reconcile(self) -> None:
        wanted = {w.url for w in self.registry.workers() if w.healthy}
        for url in list(self._subs):
            if url not in wanted:
                self._unsubscribe(url)
        for url in wanted - set(self._subs):
            self._subscribe(url)

    def _subscribe(self, url: str) -> None:
        try:
            client = self.registry.client(url)
        except KeyError:
            return
        method = getattr(client, "subscribe_kv_events", None)
        if method is None or not getattr(client, "kv_events_method", ""):
            return  # the protocol has no SubscribeKvEvents: the fallback routes it
        sub = KvEventSubscription(
            url, method, self.index, heartbeat_s=self.heartbeat_s, **self._options
        )
        self._subs[url] = sub
        sub.start()

    def _unsubscribe(self, url: str) -> None:
        sub = self._subs.pop(url, None)
        if sub is not None:
            sub.cancel()  # entries dropped now; its task winds down in the background
            ending = asyncio.get_running_loop().create_task(sub.stop())
            self._ending.add(ending)
            ending.add_done_callback(self._ending.discard)
        self.index.drop_worker(url)
