"""Start a worker: resolve the model, build the engine, serve gRPC until told to stop."""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path

import grpc
import torch

from tandem.engine.builtin import resolve_model
from tandem.engine.core import EmbeddedEngine
from tandem.engine.kv_store import KvStore
from tandem.engine.null import NullEngine, null_shape
from tandem.engine.prefix_cache import PrefixCache
from tandem.engine.protocol import Engine
from tandem.engine.runner import ModelRunner
from tandem.hostport import join_host_port
from tandem.models.info import ModelInfo, load_model_info
from tandem.models.processor import load_processor
from tandem.models.video import load_video_processor, text_encoder
from tandem.worker.config import WorkerConfig
from tandem.worker.kv_channel import KvChannelClient, KvChannelServer
from tandem.worker.marker import server_interceptors
from tandem.worker.media_limits import MediaRefsLimits
from tandem.worker.vllm.adapter import add_vllm_service
from tandem.worker.vllm.leg_counter import CountingServicer
from tandem.worker.vllm.media_refs import MediaRefsProcessor

log = logging.getLogger("tandem.worker")

GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", 256 << 20),
    ("grpc.max_send_message_length", 256 << 20),
    ("grpc.so_reuseport", 0),
]


class WorkerServer:
    """One worker process: the VllmEngine service and the KV side channel on one port."""

    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        torch.set_num_threads(config.threads)
        null = config.engine == "null"
        model_dir = resolve_model(config.model, weights=not null)
        self.info = load_model_info(model_dir, config.model)
        self.engine: Engine = (
            _null_engine(config, self.info) if null else _embedded_engine(config, model_dir)
        )
        shape = self.engine.shape
        refs = None
        if config.accepts_media_refs:
            limits = MediaRefsLimits(config.media_limits)
            refs = MediaRefsProcessor(
                self.info,
                load_processor(model_dir),
                config.media,
                limits,
                video=load_video_processor(model_dir, self.info.takes_video),
                encode=text_encoder(model_dir) if self.info.takes_video else None,
            )
        self.kv_client = KvChannelClient(shape)
        self.server = grpc.aio.server(
            options=GRPC_OPTIONS,
            interceptors=server_interceptors(config.test_only_advertise_as_vllm),
        )
        self.port = self.server.add_insecure_port(join_host_port(config.host, config.port))
        # Every worker counts what each PD leg brings it (bytes, pixel bytes): cheap, and
        # how benchmarks and compatibility tests see what a gateway put on each leg.
        # KV params name the advertised host, never the bind address (docs/operations.md).
        self.servicer = CountingServicer(
            config, self.info, self.engine, refs, self.kv_client, (config.dial_host, self.port)
        )
        add_vllm_service(self.servicer, self.server)
        channel = KvChannelServer(self.engine.kv_store, shape, self.servicer.stats)
        self.server.add_generic_rpc_handlers((channel.handler(),))
        self._expiry: asyncio.Task | None = None

    async def start(self) -> None:
        self.engine.start()
        await self.server.start()
        self._expiry = asyncio.create_task(self._expire_leases())
        log.info(
            "tandem worker ready on %s, advertised as %s (engine=%s, model=%s, role=%s, "
            "supports_vision=%s, mm_processor=%s)",
            join_host_port(self.config.host, self.port),
            self.address,
            self.config.engine,
            self.config.model_name,
            self.config.role,
            not self.config.language_model_only,
            "inprocess" if self.config.accepts_media_refs else "off",
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
        await self.kv_client.close()
        self.engine.stop()


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
    print(f"TANDEM_WORKER_READY {server.address}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("worker shutting down")
    await server.stop()
