"""Stage: pick a worker and open its stream, retrying retryable failures elsewhere.

A request is retried only while nothing has reached the client: a failure before
the worker's first frame (or a refused call) moves to a freshly selected worker,
with jittered backoff; a failure after that is reported as a stream error.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import grpc

from tandem.errors import WORKER_ERROR_CODE_KEY, TandemError, error_from_grpc, make_error
from tandem.gateway import metrics
from tandem.gateway.config import GatewayConfig
from tandem.gateway.multimodal.path import check_media_ref_schemes, filter_media_ref_capable
from tandem.gateway.pd.leg_bytes import record_leg
from tandem.gateway.pipeline.context import RequestContext
from tandem.gateway.workers.client import GenerateStream
from tandem.gateway.workers.policies.base import Policy, SelectionInput
from tandem.gateway.workers.registry import WorkerRegistry
from tandem.gateway.workers.worker import Worker
from tandem.wire.pixels import PixelPayload
from tandem.wire.proto import GenerateRequest, pb

log = logging.getLogger("tandem.gateway.dispatch")


class Frames(Protocol):
    """What an opened stream yields: frames, and ``aclose`` to drop what is left."""

    def __aiter__(self) -> AsyncIterator[pb.GenerateResponse]: ...

    def __anext__(self) -> Awaitable[pb.GenerateResponse]: ...

    async def aclose(self) -> None: ...


@dataclass(slots=True)
class OpenedStream:
    """A worker stream whose first frame has arrived; ``close`` settles the accounting."""

    frames: Frames
    close: Callable[[bool], None]

    async def abandon(self) -> None:
        """Drop the worker call(s) and settle the counts, if nothing else did (idempotent)."""
        try:
            await self.frames.aclose()
        finally:
            self.close(False)


def selection_input(ctx: RequestContext) -> SelectionInput:
    return SelectionInput(ctx.routing_ids(), ctx.media_runs, ctx.request_id)


def candidates(
    registry: WorkerRegistry, ctx: RequestContext, role: str, exclude: set[str]
) -> list[Worker]:
    pool = [w for w in registry.available(role, ctx.model.model_id) if w.url not in exclude]
    if ctx.image_urls and role in ("regular", "prefill"):
        pool = [w for w in pool if w.supports_vision]
    if ctx.mm_path == "worker":
        pool = filter_media_ref_capable(pool, lambda w: w.accepts_media_refs, role)
        if ctx.refs_for_tandem_workers_only:
            # URLs are handed only to workers that fetch under Tandem's media guard; a
            # vLLM worker registered after the media stage decided gets none of them.
            pool = [w for w in pool if w.enforces_tandem_media_policy]
    return pool


def pick(policy: Policy, pool: Sequence[Worker], ctx: RequestContext, role: str) -> Worker:
    worker = policy.select(pool, selection_input(ctx)) if pool else None
    if worker is None:
        raise make_error(
            "no_available_workers", f"no healthy {role} worker for model {ctx.model.model_id!r}"
        )
    return worker


def send(
    registry: WorkerRegistry,
    worker: Worker,
    request: GenerateRequest,
    timeout_s: float,
    pixels: PixelPayload | None = None,
    *,
    error_code: str = "worker_error",
) -> GenerateStream:
    """Start the call; the request (and ``pixels``) are serialized before this returns.

    Raw pixels are normalized here for a worker that does not normalize on device. A
    worker removed from the registry since it was selected (``DELETE /workers`` between
    two PD legs) fails the leg with ``error_code`` as a 503 charged to no worker.
    """
    try:
        client = registry.client(worker.url)
    except KeyError:
        err = make_error(
            error_code,
            f"worker {worker.url} was removed while the request was in flight",
            status=503,
            retryable=True,
        )
        err.leg = None  # not the worker's fault: no breaker counts it
        raise err from None
    if pixels is not None:
        pixels = pixels.for_worker(worker.device_normalizes)
    return client.generate(request, timeout=timeout_s, pixels=pixels)


async def first_frame(
    stream: GenerateStream, worker: Worker, error_code: str
) -> tuple[GenerateStream, pb.GenerateResponse]:
    """Wait for the worker's first frame; failures come back as TandemError."""
    try:
        first = await anext(stream)
    except grpc.aio.AioRpcError as err:
        raise _from_rpc_error(error_code, err) from None
    except StopAsyncIteration:
        raise make_error(
            error_code, f"worker {worker.url} ended the stream without output"
        ) from None
    return stream, first


async def start_stream(
    registry: WorkerRegistry,
    worker: Worker,
    request: GenerateRequest,
    timeout_s: float,
    error_code: str,
) -> tuple[GenerateStream, pb.GenerateResponse]:
    """``send`` and ``first_frame`` for a leg that carries no pixel payload."""
    stream = send(registry, worker, request, timeout_s, error_code=error_code)
    return await first_frame(stream, worker, error_code)


class Relay:
    """The frames of one opened worker stream, its first frame included.

    Mid-stream gRPC failures come out as ``error_code``. ``aclose`` drops the worker
    call (Abort, unless it completed) even when iteration never started: an async
    generator that never ran skips its ``finally``, and a stream whose SSE response
    never began must still end its worker call.
    """

    __slots__ = ("_error_code", "_first", "_stream")

    def __init__(self, stream: GenerateStream, first: pb.GenerateResponse, error_code: str) -> None:
        self._stream = stream
        self._first: pb.GenerateResponse | None = first
        self._error_code = error_code

    def __aiter__(self) -> Relay:
        return self

    async def __anext__(self) -> pb.GenerateResponse:
        first, self._first = self._first, None
        if first is not None:
            return first
        try:
            return await anext(self._stream)
        except StopAsyncIteration:
            await self.aclose()
            raise
        except grpc.aio.AioRpcError as err:
            await self.aclose()
            raise _from_rpc_error(self._error_code, err) from None
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        self._first = None
        await self._stream.aclose()


def relay(stream: GenerateStream, first: pb.GenerateResponse, error_code: str) -> Relay:
    """Yield the stream's frames (the first one included); map mid-stream failures."""
    return Relay(stream, first, error_code)


def claim(worker: Worker, policy: Policy, ctx: RequestContext) -> Callable[[bool], None]:
    """Count the request against ``worker``; the returned callback settles it once."""
    worker.in_flight += 1
    metrics.WORKER_IN_FLIGHT.labels(worker.url).set(worker.in_flight)
    settled = False

    def close(ok: bool) -> None:
        nonlocal settled
        if settled:
            return
        settled = True
        worker.in_flight -= 1
        metrics.WORKER_IN_FLIGHT.labels(worker.url).set(worker.in_flight)
        if ok:
            worker.breaker.record_success()
        policy.on_request_complete(worker, selection_input(ctx))

    return close


def next_attempt(ctx: RequestContext, attempt: int) -> None:
    """Give a retried request a fresh backend id: the failed try's legs were dropped, and
    the Abort a worker got for that id (or remembers, if it arrived first) must not
    end the retry. Worker logs still show the gateway's id, with a ``-retryN`` suffix."""
    assert ctx.wire is not None
    ctx.wire.request_id = f"{ctx.request_id}-retry{attempt}"


async def backoff(attempt: int) -> None:
    await asyncio.sleep(random.uniform(0.5, 1.0) * min(0.05 * 2**attempt, 1.0))


class AggregatedDispatcher:
    """One worker per request (``--worker-urls``)."""

    def __init__(self, registry: WorkerRegistry, policy: Policy, config: GatewayConfig) -> None:
        self.registry = registry
        self.policy = policy
        self.config = config

    async def open(self, ctx: RequestContext) -> OpenedStream:
        assert ctx.wire is not None
        record_leg("aggregated", ctx.wire, ctx.pixels)
        tried: set[str] = set()
        attempt = 0
        while True:
            pool = candidates(self.registry, ctx, "regular", tried)
            worker = pick(self.policy, pool, ctx, "worker")
            if ctx.mm_path == "worker":
                # As for a PD pair: every ref's scheme must be one the worker accepts (400).
                check_media_ref_schemes(ctx.image_urls, [worker.media_ref_schemes])
            close = claim(worker, self.policy, ctx)
            ctx.served_by = [worker.url]
            timeout = self.config.request_timeout_s
            try:
                stream = send(self.registry, worker, ctx.wire, timeout, ctx.pixels)
                ctx.pixels = None  # sent: the gateway keeps no pixel copy (behaviour A)
                stream, first = await first_frame(stream, worker, "worker_error")
            except TandemError as err:
                close(False)
                if err.status >= 500:
                    worker.breaker.record_failure()
                # An image request's pixels are gone once sent: it cannot be sent again.
                resendable = not ctx.had_pixels
                if not (err.retryable and resendable) or attempt >= self.config.max_retries:
                    raise
                log.warning("request %s: %s failed (%s); retrying", ctx.request_id, worker.url, err)
                attempt += 1
                next_attempt(ctx, attempt)
                tried.add(worker.url)
                metrics.RETRIES.labels(ctx.route).inc()
                await backoff(attempt)
                continue
            except BaseException:
                close(False)  # a timeout, a client that left, a bug: settle the count
                raise
            return OpenedStream(relay(stream, first, "worker_error"), close)


def _from_rpc_error(error_code: str, err: grpc.aio.AioRpcError) -> TandemError:
    worker_code = next(
        (str(v) for k, v in err.trailing_metadata() or () if k == WORKER_ERROR_CODE_KEY), None
    )
    return error_from_grpc(error_code, err.code(), err.details(), worker_code)
