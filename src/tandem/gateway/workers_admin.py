"""Worker admin API: list, add and remove workers while the gateway runs.

Who may call it is decided before the route runs (gateway/http/access_control.py). The routes
themselves trust nothing in the request: the body is bounded and must be a JSON object,
and a worker that cannot be registered is reported by a code, never by its gRPC details
(which would tell a caller what listens on any host and port the gateway can reach); the
details go to the gateway log.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tandem.ascii_int import ascii_int
from tandem.errors import TandemError, make_error
from tandem.gateway.http.json_bodies import error_response, json_response
from tandem.gateway.state import GatewayState
from tandem.gateway.workers.registry import WorkerUnreachableError
from tandem.gateway.workers.worker import ROLES, Worker

log = logging.getLogger("tandem.gateway.workers")

# A registration is {"url": "host:port", "role": "..."}: a few hundred bytes at most.
MAX_ADMIN_BODY = 4096


def describe(worker: Worker) -> dict[str, Any]:
    return {
        "url": worker.url,
        "role": worker.role,
        "model": worker.model_id,
        "healthy": worker.healthy,
        "circuit": worker.breaker.state,
        "in_flight": worker.in_flight,
        "labels": dict(worker.labels),
    }


def admin_routes(state: GatewayState) -> list[Route]:
    async def list_workers(request: Request) -> Response:
        return json_response({"workers": [describe(w) for w in state.registry.workers()]})

    async def add_worker(request: Request) -> Response:
        if refused := _single_process_only(state):
            return refused
        try:
            body = await _json_object(request)
            url, role = body.get("url"), body.get("role", "regular")
            if not isinstance(url, str) or not url:
                raise make_error("invalid_request", "'url' (host:port) is required", param="url")
            if role not in ROLES:
                raise make_error(
                    "invalid_request", f"'role' must be one of {', '.join(ROLES)}", param="role"
                )
            try:
                worker = await state.registry.add(url, role)
            except WorkerUnreachableError as exc:
                log.warning("registering worker %s failed: %s", exc.url, exc.reason)
                raise make_error(
                    "worker_unreachable",
                    f"worker {url!r} did not answer its registration calls; "
                    "the reason is in the gateway log",
                    param="url",
                ) from None
            except ValueError as exc:
                raise make_error("invalid_request", str(exc), param="url") from None
            try:
                await state.ensure_model()
            except TandemError:
                # The first worker is the source of the model files: without them the
                # gateway cannot serve it, so the registration is undone as a whole.
                state.registry.remove(worker.url)
                raise
        except TandemError as err:
            return error_response(err)
        return json_response(describe(worker), status=201)

    async def remove_worker(request: Request) -> Response:
        if refused := _single_process_only(state):
            return refused
        url = request.query_params.get("url", "")
        if not state.registry.remove(url):
            return error_response(make_error("worker_not_found", f"no worker {url!r}"))
        return json_response({"removed": url})

    return [
        Route("/workers", list_workers, methods=["GET"]),
        Route("/workers", add_worker, methods=["POST"]),
        Route("/workers", remove_worker, methods=["DELETE"]),
    ]


def _single_process_only(state: GatewayState) -> Response | None:
    """Under ``--processes N`` a change would reach the one process that took the connection
    while the others kept their pools; refused rather than broadcast (a broadcast would need
    every process to reach every other, and a half-applied change is worse than none).
    Listing stays: every process starts from the same workers."""
    if state.config.processes <= 1:
        return None
    return error_response(
        make_error(
            "admin_api_multiprocess",
            f"the gateway runs --processes {state.config.processes}: a worker added or removed "
            "here would reach one process only; change --worker-urls and restart instead",
        )
    )


async def _json_object(request: Request) -> dict[str, Any]:
    raw = await _bounded_body(request, MAX_ADMIN_BODY)
    try:
        body = json.loads(raw or b"{}")
    except ValueError:  # bad JSON or bad UTF-8
        raise make_error("invalid_request", "body must be JSON") from None
    if not isinstance(body, dict):
        raise make_error("invalid_request", "body must be a JSON object")
    return body


async def _bounded_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 past ``limit`` bytes (declared or streamed)."""
    declared = ascii_int(request.headers.get("content-length"))
    too_large = make_error("payload_too_large", f"admin request body is over {limit} bytes")
    if declared is not None and declared > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)
