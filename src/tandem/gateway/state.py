"""Everything the gateway holds while it runs: config, workers, model, dispatcher."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from functools import partial

from tandem.errors import TandemError, make_error
from tandem.gateway.admission import AdmissionQueue, PixelBudget
from tandem.gateway.backend import Backend, make_backend
from tandem.gateway.config import GatewayConfig
from tandem.gateway.dispatch.aggregated import AggregatedDispatcher
from tandem.gateway.dispatch.base import Dispatcher
from tandem.gateway.history.factory import open_store
from tandem.gateway.history.store import HistoryError, ResponseStore
from tandem.gateway.kv_events.manager import KvEventManager
from tandem.gateway.model import ModelHandle
from tandem.gateway.multimodal.pixel_cache import PixelCache
from tandem.gateway.multimodal.pool import ImagePool
from tandem.gateway.pd.dispatcher import PDDispatcher
from tandem.gateway.workers.breaker import CircuitBreaker
from tandem.gateway.workers.health import HealthChecker
from tandem.gateway.workers.policies.factory import make_policy
from tandem.gateway.workers.policies.kv_events import KvEventsPolicy
from tandem.gateway.workers.registry import WorkerRegistry
from tandem.gateway.workers.worker import Worker
from tandem.wire.shm import sweep_stale_segments

log = logging.getLogger("tandem.gateway")


@dataclass(slots=True)
class GatewayState:
    config: GatewayConfig
    registry: WorkerRegistry = field(default_factory=WorkerRegistry)
    backend: Backend = field(init=False)  # the workers' protocol (gateway/backends)
    model: ModelHandle | None = None
    health: HealthChecker | None = None
    dispatcher: Dispatcher = field(init=False)
    draining: bool = False  # set on SIGTERM: new generation requests get 503 shutting_down
    admission: AdmissionQueue = field(init=False)
    pixel_budget: PixelBudget = field(init=False)
    # Image work off the loop's process (--mm-workers; None until start(), and with 0) and
    # the per-image pixel cache (--mm-pixel-cache-mb): gateway/multimodal/pool.py.
    image_pool: ImagePool | None = field(init=False, default=None)
    pixel_cache: PixelCache = field(init=False)
    # Stored Responses API conversations; None with --history-backend none. Built here,
    # connected by start(), closed by stop().
    history: ResponseStore | None = field(init=False, default=None)
    # The workers' KV-event subscriptions, only when a policy is ``kv_events``.
    kv_events: KvEventManager | None = field(init=False, default=None)
    _model_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def __post_init__(self) -> None:
        config = self.config
        self.admission = AdmissionQueue(config.max_concurrent_requests, config.max_queued_requests)
        self.pixel_budget = PixelBudget(config.mm_max_inflight_bytes)
        self.pixel_cache = PixelCache(config.mm_pixel_cache_mb << 20)
        self.history = open_store(config)
        policy = make_policy(config.policy)
        prefill_policy = make_policy(config.prefill_policy or config.policy)
        decode_policy = make_policy(config.decode_policy or config.policy)

        def forget(event: str, worker: Worker) -> None:
            if event == "removed":
                for known in (policy, prefill_policy, decode_policy):
                    known.remove_worker(worker.url)

        self.registry.on_change(forget)
        fed = [p for p in (policy, prefill_policy, decode_policy) if isinstance(p, KvEventsPolicy)]
        if fed:
            self.kv_events = KvEventManager(self.registry)
            for known in fed:
                known.bind(self.kv_events)
        self.backend = make_backend(config)
        self.registry.sender = self.backend.sender
        self.registry.breaker_factory = partial(
            CircuitBreaker, config.cb_failure_threshold, config.cb_timeout_s
        )
        if config.pd_disaggregation:
            self.dispatcher = PDDispatcher(
                self.registry, self.backend, prefill_policy, decode_policy, config
            )
        else:
            self.dispatcher = AggregatedDispatcher(self.registry, policy, config)

    async def start(self) -> None:
        config = self.config
        # Segments of gateways that died mid-request (docs/operations.md, "Shared-memory
        # tensor transport"); whatever the mode, as the dead one may have used shm.
        sweep_stale_segments()
        if self.history is not None:
            # First: a database that is down fails the start before any worker is dialled.
            try:
                await self.history.start()
            except HistoryError as err:  # one line, the URL's password masked
                raise SystemExit(f"tandem gateway: error: {err}") from None
            log.info("stored responses: %r", self.history)
        for url in config.worker_urls:
            await self.registry.add(url, "regular")
        for url in config.prefill_urls:
            await self.registry.add(url, "prefill")
        for url in config.decode_urls:
            await self.registry.add(url, "decode")
        for url in config.encode_urls:
            await self.registry.add(url, "encode")
        self.health = HealthChecker(
            self.registry,
            interval_s=config.health_interval_s,
            timeout_s=config.health_timeout_s,
            unhealthy_after=config.health_failure_threshold,
        )
        self.health.start()
        if self.kv_events is not None:
            self.kv_events.start()
        if config.mm_workers:
            pool = ImagePool(config.mm_workers, config.mm_workers_nice)
            await pool.start()  # warmed before the first request (imports done once)
            self.image_pool = pool
        if config.model_path is not None or len(self.registry):
            try:
                await self.ensure_model()
            except TandemError as err:
                if config.model_path is not None:  # a local directory will not get better
                    raise SystemExit(f"--model-path {config.model_path}: {err.message}") from None
                # A worker's files may load later: every request tries again until then.
                log.warning("%s; requests get 503 until they load", err.message)

    async def ensure_model(self) -> ModelHandle | None:
        """Load tokenizer, template and processor once: from --model-path or a worker.

        Raises 503 ``model_files_unavailable`` when they cannot be fetched or loaded; the
        reason (a worker's gRPC status, a file error) is logged, not sent to the client.
        """
        if self.model is not None:
            return self.model
        async with self._model_lock:
            if self.model is not None:
                return self.model
            workers = self.registry.workers()
            model_id = self.config.served_model_name or (workers[0].model_id if workers else None)
            source = str(self.config.model_path) if self.config.model_path else "a worker"
            try:
                if self.config.model_path is not None:
                    name = model_id or self.config.model_path.name
                    self.model = ModelHandle.from_dir(
                        self.config.model_path, name, self.config.prompt_cache_tokens
                    )
                elif workers:
                    source = workers[0].url
                    archive = await self.registry.client(source).get_tokenizer(timeout=30)
                    self.model = ModelHandle.from_archive(
                        archive, model_id or workers[0].model_id, self.config.prompt_cache_tokens
                    )
                    log.info("loaded tokenizer and processor of %s from %s", model_id, source)
            except Exception as exc:  # gRPC, zip, JSON, template or tokenizer errors alike
                log.warning("could not load the model files from %s: %r", source, exc)
                raise make_error(
                    "model_files_unavailable",
                    "the model's tokenizer, chat template or processor could not be loaded",
                ) from None
        return self.model

    async def stop(self) -> None:
        if self.health is not None:
            await self.health.stop()
        if self.kv_events is not None:
            await self.kv_events.stop()
        await self.registry.close()
        if self.image_pool is not None:
            pool, self.image_pool = self.image_pool, None
            await pool.stop()
        self.pixel_cache.clear()
        self.backend.sender.close()  # segments of calls that never ended
        if self.history is not None:
            await self.history.close()
