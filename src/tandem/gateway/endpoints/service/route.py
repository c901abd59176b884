"""The service's own routes: ``/health``, ``/metrics`` (Prometheus) and ``/openapi.json``."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tandem import __version__
from tandem.gateway import metrics
from tandem.gateway.endpoints.service.openapi import openapi_document
from tandem.gateway.http.json_bodies import json_response
from tandem.gateway.multiprocess import metrics_dir
from tandem.gateway.state import GatewayState


def service_routes(state: GatewayState) -> list[Route]:
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
        # Under --processes N: every process's metrics, summed (multiprocess/metrics_dir.py).
        body = metrics_dir.latest(metrics.REGISTRY, state.config.processes)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    return [
        Route("/health", health, methods=["GET"]),
        Route("/metrics", prometheus, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
    ]
