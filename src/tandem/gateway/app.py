"""The HTTP front: OpenAI routes, health, metrics, worker admin. Thin by design.

Each generation route runs the pipeline stages in order over one
:class:`RequestContext`; every failure is a :class:`TandemError` rendered as
OpenAI error JSON (or, once a stream has started, as an SSE error event).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from tandem import __version__
from tandem.errors import TandemError, make_error
from tandem.gateway import metrics
from tandem.gateway.access_control import access_middleware, tenant_of
from tandem.gateway.access_log import REQUEST_ID_HEADER, RequestRecord
from tandem.gateway.admission import PixelLease, Slot, rejected
from tandem.gateway.api.openapi import openapi_document
from tandem.gateway.api.responses import error_response, json_response
from tandem.gateway.api.schemas import parse_chat_request, parse_completion_request
from tandem.gateway.api.sse import sse_response
from tandem.gateway.pipeline.context import RequestContext
from tandem.gateway.pipeline.dispatch import OpenedStream
from tandem.gateway.pipeline.media import prepare_media
from tandem.gateway.pipeline.prompt import prepare_prompt
from tandem.gateway.pipeline.respond import collect, stream_events
from tandem.gateway.pipeline.wire_request import build_wire_request
from tandem.gateway.state import GatewayState
from tandem.gateway.workers_admin import admin_routes

log = logging.getLogger("tandem.gateway")
T = TypeVar("T")


def check_declared_size(request: Request, limit: int) -> None:
    """413 on a declared Content-Length over ``limit``, before the body is read or queued."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise make_error("payload_too_large", f"request body is over {limit} bytes")


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 as soon as it passes ``limit`` bytes."""
    check_declared_size(request, limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise make_error("payload_too_large", f"request body is over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def build_app(state: GatewayState) -> Starlette:
    async def chat(request: Request) -> Response | ReleaseAfter:
        return await generate(request, "chat", parse_chat_request)

    async def completions(request: Request) -> Response | ReleaseAfter:
        return await generate(request, "completions", parse_completion_request)

    async def generate(
        request: Request, route: str, parse: Callable[[bytes], Any]
    ) -> Response | ReleaseAfter:
        config = state.config
        record = RequestRecord(route, enabled=config.access_log, tenant=tenant_of(request))
        ctx: RequestContext | None = None
        slot: Slot | None = None
        lease: PixelLease | None = None
        try:
            if state.draining:
                raise rejected("shutting_down", "the gateway is shutting down", "shutting_down")
            check_declared_size(request, config.max_payload_size)
            # Admitted before the body is read: a queued request holds no body, no pixels.
            slot = await state.admission.acquire(config.request_timeout_s)
            body = parse(await read_body(request, config.max_payload_size))
            # Charged by the media stage before any image is decoded, then holding only
            # the pixel tensor (docs/operations.md, "Memory bounds for images").
            lease = state.pixel_budget.lease()
            ctx = await prepare(body, route, record.request_id, lease)
            assert state.dispatcher is not None
            if ctx.stream:
                opened = await _until_disconnect(request, open_within_timeout(ctx))
                _released(lease)  # the first frame is back: the pixels have gone
                events = _observed(stream_events(ctx, opened), ctx, record)
                # The slot is held until the last byte is sent (or the client is gone).
                held, slot, streamed = slot, None, ctx

                async def after_stream() -> None:
                    held.release()
                    # Only counts if the stream never started (a client gone before it).
                    record.finish(499, "client_disconnected", streamed)
                    # A stream that never started must still end its worker calls and
                    # settle their in-flight counts (no-ops after a normal end).
                    await opened.abandon()

                return ReleaseAfter(_tagged(sse_response(events), record), after_stream)
            answer = await _until_disconnect(request, run_to_answer(ctx, lease))
        except TandemError as err:
            record.finish(err.status, err.code, ctx)
            return _tagged(_error_response(err), record)
        except ClientDisconnect:
            record.finish(499, "client_disconnected", ctx)
            return Response(status_code=499)
        except Exception:
            log.exception("unexpected failure on %s (%s)", route, record.request_id)
            err = make_error("internal_error", "internal error; see the gateway log")
            record.finish(500, err.code, ctx)
            return _tagged(error_response(err), record)
        finally:
            _released(lease)
            _released(slot)
        record.finish(200, ctx=ctx)
        return _tagged(json_response(answer), record)

    async def prepare(body: Any, route: str, request_id: str, lease: PixelLease) -> RequestContext:
        model = await state.ensure_model()
        if model is None:
            raise make_error("no_available_workers", "no worker is registered yet")
        if body.model != model.model_id:
            raise make_error(
                "model_not_found", f"model {body.model!r} is not served here", param="model"
            )
        ctx = RequestContext(route, request_id, body, model, body.sampling())
        await prepare_prompt(ctx)
        build_wire_request(ctx)
        workers = state.registry.workers(model_id=model.model_id)
        timeout = state.config.request_timeout_s
        try:
            await asyncio.wait_for(prepare_media(ctx, state.config, workers, lease), timeout)
        except TimeoutError:
            raise make_error(
                "request_timeout", f"media not ready within --request-timeout-secs={timeout}"
            ) from None
        return ctx

    async def run_to_answer(ctx: RequestContext, lease: PixelLease | None) -> dict[str, Any]:
        assert state.dispatcher is not None
        try:
            async with asyncio.timeout(state.config.request_timeout_s):
                opened = await state.dispatcher.open(ctx)
                _released(lease)  # the first frame is back: the pixels have gone
                return await collect(ctx, opened)
        except TimeoutError:
            raise _timed_out("no answer") from None

    async def open_within_timeout(ctx: RequestContext) -> OpenedStream:
        """A stream's legs up to the first frame; the rest is bounded by the gRPC deadline."""
        assert state.dispatcher is not None
        try:
            async with asyncio.timeout(state.config.request_timeout_s):
                return await state.dispatcher.open(ctx)
        except TimeoutError:
            raise _timed_out("no first token") from None

    def _timed_out(what: str) -> TandemError:
        limit = state.config.request_timeout_s
        return make_error("request_timeout", f"{what} within --request-timeout-secs={limit}")

    async def models(request: Request) -> Response:
        model = await state.ensure_model()
        data = []
        if model is not None:
            data.append(
                {"id": model.model_id, "object": "model", "owned_by": "tandem", "created": 0}
            )
        return json_response({"object": "list", "data": data})

    async def health(request: Request) -> Response:
        available = state.registry.available()
        status = 200 if available and not state.draining else 503
        return json_response(
            {"status": "ok" if status == 200 else "unavailable", "workers": len(available)},
            status=status,
        )

    async def openapi(request: Request) -> Response:
        model = await state.ensure_model()
        return json_response(openapi_document(model.model_id if model else None, __version__))

    async def prometheus(request: Request) -> Response:
        return Response(generate_latest(metrics.REGISTRY), media_type=CONTENT_TYPE_LATEST)

    async def not_found(request: Request, exc: Exception) -> Response:
        return error_response(make_error("not_found", f"no route {request.url.path}"))

    async def coded(request: Request, exc: Exception) -> Response:
        # A route without its own handling (e.g. /v1/models when the model files cannot
        # be loaded) still answers with its code, never a bare 500.
        assert isinstance(exc, TandemError)
        return _error_response(exc)

    routes = [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", prometheus, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
        *admin_routes(state),
    ]
    return Starlette(
        routes=routes,
        exception_handlers={404: not_found, TandemError: coded},
        middleware=access_middleware(state.config),  # API keys: gateway/auth.py
    )


async def _until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Run ``work``; cancel it (and so abort the worker call) if the client goes away.

    The client leaving surfaces as :class:`ClientDisconnect`, which the route answers
    (for the log and metrics) with 499; a bare CancelledError would reach the server as
    an application failure.
    """
    task = asyncio.ensure_future(work)
    gone = False

    async def watch() -> None:
        nonlocal gone
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                gone = True
                task.cancel()
                return

    watcher = asyncio.ensure_future(watch())
    try:
        return await task
    except asyncio.CancelledError:
        if gone and task.cancelled():
            raise ClientDisconnect() from None
        raise
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


async def _observed(
    events: AsyncIterator[dict[str, Any]], ctx: RequestContext, record: RequestRecord
) -> AsyncIterator[dict[str, Any]]:
    status, code = 200, ""
    try:
        async for event in events:
            yield event
    except TandemError as err:
        status, code = err.status, err.code
        raise
    except (asyncio.CancelledError, GeneratorExit):
        status, code = 499, "client_disconnected"  # the client left mid-stream
        raise
    finally:
        record.finish(status, code, ctx)


class ReleaseAfter:
    """An ASGI response that runs ``release`` once it has been sent, whatever happened.

    A generator's ``finally`` does not run if the generator never started (a client gone
    before the first byte); this wrapper's does, so an admission slot cannot leak.
    """

    def __init__(self, response: Response, release: Callable[[], Awaitable[None]]) -> None:
        self.response = response
        self.release = release

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await self.response(scope, receive, send)
        finally:
            await self.release()


def _released(held: Slot | PixelLease | None) -> None:
    if held is not None:
        held.release()


def _error_response(err: TandemError) -> Response:
    response = error_response(err)
    if err.retry_after is not None:
        response.headers["Retry-After"] = str(err.retry_after)
    return response


def _tagged(response: Response, record: RequestRecord) -> Response:
    """The request id on every answer, so a client can quote it against the logs."""
    response.headers[REQUEST_ID_HEADER] = record.request_id
    return response
