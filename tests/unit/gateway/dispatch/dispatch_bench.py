"""A gateway's dispatch side over fake workers: registry, dispatcher, request contexts.

The registry, the dispatcher (built by ``GatewayState`` from a ``GatewayConfig``, as the
gateway builds it) and the prompt, wire-request and media stages are the real ones; the
workers behind the registry are :mod:`fake_worker_client` fakes.

Kept out of conftest.py under a unique module name so test modules can import it.
"""

from __future__ import annotations

import asyncio
import base64
import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from fake_worker_client import MODEL, FakeWorkers, GenerateCall, WorkerInfo
from PIL import Image

from tandem.gateway.config import GatewayConfig
from tandem.gateway.context import RequestContext
from tandem.gateway.dispatch.base import Dispatcher
from tandem.gateway.dispatch.streams import OpenedStream
from tandem.gateway.endpoints.chat.schema import ChatCompletionRequest
from tandem.gateway.model import ModelHandle
from tandem.gateway.pipeline.media import prepare_media
from tandem.gateway.pipeline.prompt import prepare_prompt
from tandem.gateway.state import GatewayState
from tandem.gateway.workers.registry import WorkerRegistry
from tandem.gateway.workers.worker import Worker, WorkerRole
from tandem.wire.proto import pb

# Loopback addresses only as names: nothing listens there, no socket is opened.
PREFILL_A = "127.0.0.1:7101"
PREFILL_B = "127.0.0.1:7102"
PREFILL_C = "127.0.0.1:7103"
DECODE_A = "127.0.0.1:7201"
DECODE_B = "127.0.0.1:7202"
REGULAR_A = "127.0.0.1:7301"
REGULAR_B = "127.0.0.1:7302"
REQUEST_ID = "req-dispatch-1"


@dataclass(slots=True)
class Bench:
    workers: FakeWorkers
    registry: WorkerRegistry
    state: GatewayState
    model: ModelHandle

    @property
    def config(self) -> GatewayConfig:
        return self.state.config

    @property
    def dispatcher(self) -> Dispatcher:
        return self.state.dispatcher

    def worker(self, url: str) -> Worker:
        worker = self.registry.get(url)
        assert worker is not None, url
        return worker

    def failures(self, url: str) -> int:
        """Failures the worker's circuit breaker counted."""
        return self.worker(url).breaker.consecutive_failures

    def in_flight(self) -> dict[str, int]:
        return {w.url: w.in_flight for w in self.registry.workers()}

    async def context(
        self, images: int = 0, request_id: str = REQUEST_ID, **body: Any
    ) -> RequestContext:
        """A chat request through the real prompt, wire-request and media stages."""
        parsed = ChatCompletionRequest.model_validate(chat_body(images, **body))
        ctx = RequestContext("chat", request_id, parsed.generation(), self.model)
        await prepare_prompt(ctx)
        self.state.backend.build_request(ctx)
        workers = self.registry.workers(model_id=self.model.model_id)
        await prepare_media(ctx, self.config, workers, backend=self.state.backend)
        return ctx

    async def open(self, ctx: RequestContext) -> OpenedStream:
        return await self.dispatcher.open(ctx)

    def only_call(self, url: str) -> GenerateCall:
        calls = self.workers.calls_to(url)
        assert len(calls) == 1, [c.request.request_id for c in calls]
        return calls[0]


async def build_bench(
    model: ModelHandle,
    workers: dict[str, tuple[WorkerRole, WorkerInfo]],
    **config: Any,
) -> Bench:
    """Register ``workers`` (url: role, info) behind the dispatcher ``config`` asks for."""
    fake = FakeWorkers(infos={url: info for url, (_, info) in workers.items()})
    registry = WorkerRegistry(client_factory=fake.factory)
    by_role = {
        role: [url for url, (r, _) in workers.items() if r == role]
        for role in ("regular", "prefill", "decode")
    }
    settings: dict[str, Any] = {"mm_processing": "router", **config}
    if by_role["prefill"] or by_role["decode"]:
        settings.update(
            pd_disaggregation=True, prefill_urls=by_role["prefill"], decode_urls=by_role["decode"]
        )
    else:
        settings["worker_urls"] = by_role["regular"]
    state = GatewayState(GatewayConfig(**settings), registry=registry)
    state.model = model
    for url, (role, _) in workers.items():
        await registry.add(url, role)
    return Bench(fake, registry, state, model)


async def pd_bench(
    model: ModelHandle,
    prefill: tuple[str, ...] = (PREFILL_A,),
    decode: tuple[str, ...] = (DECODE_A,),
    info: WorkerInfo | None = None,
    **config: Any,
) -> Bench:
    """Prefill and decode workers that all report ``info`` (default: Tandem workers)."""
    info = info or WorkerInfo.tandem()
    workers: dict[str, tuple[WorkerRole, WorkerInfo]] = {}
    workers.update({url: ("prefill", info) for url in prefill})
    workers.update({url: ("decode", info) for url in decode})
    return await build_bench(model, workers, **config)


async def aggregated_bench(
    model: ModelHandle, regular: tuple[str, ...] = (REGULAR_A, REGULAR_B), **config: Any
) -> Bench:
    workers: dict[str, tuple[WorkerRole, WorkerInfo]] = {
        url: ("regular", WorkerInfo.tandem()) for url in regular
    }
    return await build_bench(model, workers, **config)


async def drain(opened: OpenedStream) -> list[pb.GenerateResponse]:
    """Every frame of an opened stream, then settle its accounting as the pipeline does."""
    frames = [frame async for frame in opened.frames]
    opened.close(True)
    return frames


def image_url(seed: int = 0, size: tuple[int, int] = (64, 48)) -> str:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def chat_body(images: int = 0, **extra: Any) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [
        {"type": "image_url", "image_url": {"url": image_url(i)}} for i in range(images)
    ]
    parts.append({"type": "text", "text": "What is this?"})
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": parts}],
        "max_tokens": 8,
    }
    return {**body, **extra}


async def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll ``predicate`` until it holds (no fixed sleeps)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.002)
