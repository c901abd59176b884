"""Start a worker: resolve the model, build the engine, serve gRPC until told to stop."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import torch

from tandem.engine.builtin import resolve_model
from tandem.engine.core import EmbeddedEngine
from tandem.engine.image_encoder import ImageEncoder
from tandem.engine.kv_store import KvStore
from tandem.engine.null import NullEngine, null_shape
from tandem.engine.prefix_cache import PrefixCache
from tandem.engine.protocol import Engine
from tandem.engine.runner import ModelRunner
from tandem.hostport import join_host_port
from tandem.models.info import ModelInfo, load_model_info
from tandem.worker.adapters import adapter_for
from tandem.worker.config import WorkerConfig
from tandem.worker.context import WorkerContext
from tandem.worker.kv_channel import KvChannelClient, KvChannelServer
from tandem.worker.kv_events.publisher import KvEventPublisher, LoadFigures
from tandem.worker.marker import server_interceptors

log = logging.getLogger("tandem.worker")

GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", 256 << 20),
    ("grpc.max_send_message_length", 256 << 20),
    ("grpc.so_reuseport", 0),
]


class WorkerServer:
    """One worker process: its protocol's service and the KV side channel on one port (and,
    for SGLang, on the bootstrap port too)."""

    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        torch.set_num_threads(config.threads)
        null = config.engine == "null"
        model_dir = resolve_model(config.model, weights=not null)
        self.info = load_model_info(model_dir, config.model)
        encoder: ImageEncoder | None = None
        if null:
            null_engine = _null_engine(config, self.info)
            self.engine: Engine = null_engine
            cache = null_engine.prefix_cache
        else:
            embedded = _embedded_engine(config, model_dir)
            self.engine = embedded
            cache = embedded.prefix_cache
            if config.role == "encode":  # E/P/D: the same model's vision tower, on its thread
                encoder = ImageEncoder(embedded.runner)
        self.encoder = encoder
        self.kv_events: KvEventPublisher | None = None
        if config.kv_events:
            self.kv_events = KvEventPublisher(
                _load_of(self.engine, cache), config.kv_events_heartbeat_s
            )
            cache.set_listener(self.kv_events)
        shape = self.engine.shape
        adapter = adapter_for(config.protocol)
        self.kv_client = KvChannelClient(shape)
        self.server = grpc.aio.server(
            options=GRPC_OPTIONS,
            interceptors=server_interceptors(
                config.test_only_advertise_as_vllm, adapter.server_info_method
            ),
        )
        self.port = self.server.add_insecure_port(join_host_port(config.host, config.port))
        self.bootstrap_port = self.port
        if config.bootstrap_port is not None:
            self.bootstrap_port = self.server.add_insecure_port(
                join_host_port(config.host, config.bootstrap_port)
            )
        # KV params name the advertised host, never the bind address (docs/operations.md).
        context = WorkerContext(
            config,
            model_dir,
            self.info,
            self.engine,
            self.kv_client,
            (config.dial_host, self.port),
            self.bootstrap_port,
            encoder,
            cache,
            self.kv_events,
        )
        self.servicer = adapter.serve(context, self.server)
        channel = KvChannelServer(self.engine.kv_store, shape, self._stats)
        self.server.add_generic_rpc_handlers((channel.handler(),))
        self._expiry: asyncio.Task | None = None

    def _stats(self) -> dict[str, Any]:
        events = self.kv_events
        return {
            **self.servicer.stats(),
            "kv_events_subscribers": events.subscribers if events else 0,
            "kv_events_sequence": events.sequence if events else 0,
        }

    async def start(self) -> None:
        if self.kv_events is not None:
            self.kv_events.start(asyncio.get_running_loop())
        self.engine.start()
        await self.server.start()
        self._expiry = asyncio.create_task(self._expire_leases())
        media_refs = self.config.accepts_media_refs and self.config.protocol == "vllm"
        log.info(
            "tandem worker ready on %s, advertised as %s (protocol=%s, bootstrap_port=%s, "
            "engine=%s, model=%s, role=%s, supports_vision=%s, mm_processor=%s)",
            join_host_port(self.config.host, self.port),
            self.address,
            self.config.protocol,
            self.bootstrap_port,
            self.config.engine,
            self.config.model_name,
            self.config.role,
            not self.config.language_model_only,
            "inprocess" if media_refs else "off",
        )

    @property
    def address(self) -> str:
        """Where others dial this worker: gRPC and the KV side channel."""
        return join_host_port(self.config.dial_host, self.port)

    async def _expire_leases(self) -> None:
        # Leases also expire lazily on access; this keeps an idle worker's count honest.
        while True:
            await asyncio.sleep(1.0)
            self.engine.kv_store.expire()

    async def stop(self, grace_s: float = 2.0) -> None:
        if self._expiry:
            self._expiry.cancel()
        await self.server.stop(grace_s)
        if self.kv_events is not None:
            await self.kv_events.stop()
        await self.kv_client.close()
        if self.encoder is not None:
            self.encoder.close()
        self.engine.stop()


def _load_of(engine: Engine, cache: PrefixCache) -> Callable[[], LoadFigures]:
    def load() -> LoadFigures:
        # token_usage: prefix-cache bytes used over its byte budget (the KV a request holds
        # while it runs is its own tensor, outside any pool, so it has no capacity to report).
        budget = cache.byte_budget
        return LoadFigures(
            running=engine.num_running,
            waiting=engine.num_waiting,
            waiting_uncached_tokens=None,  # the engine's inbox is not inspectable
            token_usage=min(1.0, cache.bytes_used / budget) if budget else 0.0,
            max_running=0,  # the engine admits every request it is given
        )

    return load


def _embedded_engine(config: WorkerConfig, model_dir: Path) -> EmbeddedEngine:
    runner = ModelRunner.load(model_dir, config.language_model_only, config.model)
    shape = runner.shape
    return EmbeddedEngine(
        runner,
        PrefixCache(shape, config.prefix_cache_bytes, config.block_size),
        KvStore(shape, config.kv_lease_s, block_size=config.block_size),
        config.block_size,
        json_any_whitespace=config.json_whitespace == "any",
    )


def _null_engine(config: WorkerConfig, info: ModelInfo) -> NullEngine:
    store = KvStore(null_shape(info), config.kv_lease_s, block_size=config.block_size)
    return NullEngine(info, store, config.null_token_delay_s, config.block_size)


async def serve(config: WorkerConfig) -> None:
    server = WorkerServer(config)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # Ready only once a SIGTERM is ours to handle: one sent just after the line (a
    # supervisor's quick stop) would otherwise kill the process before it shut down.
    print(f"TANDEM_WORKER_READY {server.address}", flush=True)
    await stop.wait()
    log.info("worker shutting down")
    await server.stop()
