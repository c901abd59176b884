"""The HTTP application around the endpoints' routes: error handlers and access control.

Each endpoint (``gateway/endpoints``) brings its routes; ``gateway/app.py`` puts them
together and hands them here.
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from tandem.errors import TandemError, make_error
from tandem.gateway.config import GatewayConfig
from tandem.gateway.http.access_control import access_middleware
from tandem.gateway.http.json_bodies import error_response
from tandem.gateway.http.render import (
    anthropic_error_response,
    coded_error_response,
    speaks_anthropic,
)


def http_app(config: GatewayConfig, routes: Sequence[BaseRoute]) -> Starlette:
    async def not_found(request: Request, exc: Exception) -> Response:
        err = make_error("not_found", f"no route {request.url.path}")
        if speaks_anthropic(request.url.path):  # the Messages API's clients read its body
            return anthropic_error_response(err)
        return error_response(err)

    async def coded(request: Request, exc: Exception) -> Response:
        # A route without its own handling (e.g. /v1/models when the model files cannot
        # be loaded) still answers with its code, never a bare 500.
        assert isinstance(exc, TandemError)
        if speaks_anthropic(request.url.path):
            return anthropic_error_response(exc)
        return coded_error_response(exc)

    return Starlette(
        routes=list(routes),
        exception_handlers={404: not_found, TandemError: coded},
        middleware=access_middleware(config),  # API keys: gateway/auth.py
    )
