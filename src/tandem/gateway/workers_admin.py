"""Worker admin API: list, add and remove workers while the gateway runs."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tandem.errors import TandemError, make_error
from tandem.gateway.api.responses import error_response, json_response
from tandem.gateway.state import GatewayState
from tandem.gateway.workers.registry import WorkerUnreachableError
from tandem.gateway.workers.worker import ROLES, Worker


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
        try:
            try:
                body = json.loads(await request.body() or b"{}")
            except json.JSONDecodeError:
                raise make_error("invalid_request", "body must be JSON") from None
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
                raise make_error("no_available_workers", str(exc)) from None
            except ValueError as exc:
                raise make_error("invalid_request", str(exc), param="url") from None
            await state.ensure_model()
        except TandemError as err:
            return error_response(err)
        return json_response(describe(worker), status=201)

    async def remove_worker(request: Request) -> Response:
        url = request.query_params.get("url", "")
        if not state.registry.remove(url):
            return error_response(make_error("worker_not_found", f"no worker {url!r}"))
        return json_response({"removed": url})

    return [
        Route("/workers", list_workers, methods=["GET"]),
        Route("/workers", add_worker, methods=["POST"]),
        Route("/workers", remove_worker, methods=["DELETE"]),
    ]
