"""Background health checks: call ``HealthCheck`` on every worker, every few seconds.

A healthy worker is also asked for its engine's queue (``GetLoads``, into
``Worker.engine_load``), which load-aware policies read beside this gateway's own count.
A failed or unhealthy answer marks the worker unhealthy (policies stop seeing it)
and counts as a breaker failure; a healthy answer marks it healthy again and
counts as a breaker success. When checks had failed too (the worker was down), a
check begun after the breaker opened is its probe: its success closes the breaker
without risking a user request, so a worker back on its address serves again within
one interval (plus the channel's reconnect, at most half a second:
``backends/vllm/client.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import grpc

from tandem.gateway import metrics
from tandem.gateway.workers.protocol import WorkerClient
from tandem.gateway.workers.registry import WorkerRegistry
from tandem.gateway.workers.worker import EngineLoad, Worker

log = logging.getLogger("tandem.gateway.workers")


class HealthChecker:
    def __init__(
        self,
        registry: WorkerRegistry,
        interval_s: float = 5.0,
        timeout_s: float = 2.0,
        unhealthy_after: int = 2,
    ) -> None:
        if interval_s <= 0 or timeout_s <= 0:
            raise ValueError("interval_s and timeout_s must be positive")
        if unhealthy_after < 1:
            raise ValueError("unhealthy_after must be >= 1")
        self.registry = registry
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        # One slow answer on a loaded machine is not an outage: a worker leaves the pool
        # after this many failed checks in a row, and comes back on the first good one.
        self.unhealthy_after = unhealthy_after
        self._failures: dict[str, int] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the periodic loop on the running event loop (idempotent)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def check_once(self) -> dict[str, bool]:
        """Check every registered worker concurrently; returns url → healthy."""
        workers = self.registry.workers()
        results = await asyncio.gather(*(self._check(w) for w in workers))
        return {w.url: ok for w, ok in zip(workers, results, strict=True)}

    async def _check(self, worker: Worker) -> bool:
        try:
            client = self.registry.client(worker.url)
        except KeyError:
            return False  # removed since the list was taken
        started = worker.breaker.now()
        # The client has its own deadline; wait_for is the backstop against a hung channel.
        try:
            ok = await asyncio.wait_for(client.health_check(self.timeout_s), self.timeout_s * 2)
        except TimeoutError:
            ok = False
        if self.registry.get(worker.url) is not worker:
            return ok  # removed (or replaced) while we waited: do not touch it
        failed_before = self._failures.get(worker.url, 0)
        failures = 0 if ok else failed_before + 1
        self._failures[worker.url] = failures
        healthy = ok or (worker.healthy and failures < self.unhealthy_after)
        if healthy != worker.healthy:
            log.warning("worker %s is now %s", worker.url, "healthy" if healthy else "unhealthy")
        worker.healthy = healthy
        worker.engine_load = await self._load(client, worker) if ok else None
        metrics.WORKER_HEALTHY.labels(worker.url).set(1 if healthy else 0)
        if ok and failed_before:
            # Back after checks failed too (down, restarted): a check begun since the
            # breaker opened is its probe. A worker whose checks pass while its requests
            # fail keeps the breaker's cooldown: its health answer proves nothing then.
            worker.breaker.record_success(started)
        elif ok:
            worker.breaker.record_success()
        else:
            worker.breaker.record_failure()
        metrics.CIRCUIT_OPEN.labels(worker.url).set(1 if worker.breaker.state == "open" else 0)
        return ok

    async def _load(self, client: WorkerClient, worker: Worker) -> EngineLoad | None:
        """The engine's queue for load-aware policies; None when it cannot say now."""
        try:
            return await asyncio.wait_for(client.engine_load(self.timeout_s), self.timeout_s * 2)
        except (TimeoutError, grpc.aio.AioRpcError) as err:
            log.debug("loads of %s not read: %r", worker.url, err)
            return None

    async def _run(self) -> None:
        while True:
            try:
                await self.check_once()
            except Exception:  # keep checking; one bad round must not end the loop
                log.exception("health check round failed")
            await asyncio.sleep(self.interval_s)
