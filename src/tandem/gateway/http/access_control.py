"""ASGI middleware that applies the access rules of :mod:`tandem.gateway.auth` to every request.

It runs before routing, so a refused request never reaches a route: no body is read, no
admission slot is taken. A request that passes carries what its key said in the scope's
``state`` (``request.state`` in a route): ``tenant`` on the serving routes, for the
pipeline and the access log; ``control_plane_key`` (the key's id) on the admin API.

A serving key may come as ``Authorization: Bearer KEY`` or, as Anthropic's clients send it,
``x-api-key: KEY``: the same keys and tenants either way. A refusal on the Messages API
(``/v1/messages*``) is written in Anthropic's error body, so its SDK raises the right class.
"""

from __future__ import annotations

import logging

from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from tandem.errors import TandemError
from tandem.gateway.auth import (
    AccessPolicy,
    bearer_token,
    check_admin,
    check_serving,
    is_admin_path,
    is_loopback_bind,
    is_serving_path,
)
from tandem.gateway.config import GatewayConfig
from tandem.gateway.http.json_bodies import error_response
from tandem.gateway.http.render import anthropic_error_response, speaks_anthropic

log = logging.getLogger("tandem.gateway")


def access_policy(config: GatewayConfig) -> AccessPolicy:
    return AccessPolicy(
        serving_keys=tuple(config.serving_keys),
        control_plane_keys=tuple(config.control_plane_api_keys),
        loopback_bind=is_loopback_bind(config.host),
    )


def access_middleware(config: GatewayConfig) -> list[Middleware]:
    """The middleware list for ``Starlette(middleware=…)``; says once if /workers is shut."""
    policy = access_policy(config)
    warning = policy.startup_warning()
    if warning:
        log.warning(warning)
    return [Middleware(AccessControl, policy=policy)]


def tenant_of(request: Request) -> str | None:
    """The tenant named by the request's ``--tenant-api-key`` (None for any other key)."""
    state = request.scope.get("state") or {}
    return state.get("tenant")


class AccessControl:
    def __init__(self, app: ASGIApp, policy: AccessPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        try:
            if is_serving_path(path):
                key = check_serving(self.policy, _serving_credential(scope))
                scope.setdefault("state", {})["tenant"] = key.tenant if key else None
            elif is_admin_path(path):
                client = scope.get("client")
                peer = client[0] if client else None
                admin = check_admin(self.policy, _authorization(scope), scope["method"], peer)
                scope.setdefault("state", {})["control_plane_key"] = admin.id if admin else None
        except TandemError as err:
            anthropic = speaks_anthropic(path)
            response = anthropic_error_response(err) if anthropic else error_response(err)
            if err.status == 401:
                response.headers["WWW-Authenticate"] = "Bearer"
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _authorization(scope: Scope) -> str | None:
    return _header(scope, b"authorization")


def _serving_credential(scope: Scope) -> str | None:
    """The ``Authorization`` header, or an ``x-api-key`` read as its bearer token.

    A bearer token wins when both come; an ``Authorization`` header that carries none
    (another scheme) leaves room for ``x-api-key``, which is how Anthropic's SDK sends keys.
    """
    authorization = _authorization(scope)
    if bearer_token(authorization) is not None:
        return authorization
    api_key = _header(scope, b"x-api-key")
    if api_key is not None and api_key.strip():
        return f"Bearer {api_key.strip()}"
    return authorization


def _header(scope: Scope, wanted: bytes) -> str | None:
    for name, value in scope["headers"]:
        if name == wanted:
            return value.decode("latin-1")
    return None
