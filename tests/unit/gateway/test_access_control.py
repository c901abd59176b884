"""Access control through the real gateway app in-process (ASGI): API keys, tenant keys,
control-plane roles, the loopback-only default, open routes, and the admin body checks."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from gateway_app_fakes import chat_body, client, make_gateway

from tandem.gateway.app import build_app
from tandem.gateway.auth import parse_control_plane_key, parse_tenant_key
from tandem.gateway.state import GatewayState

CHAT = "/v1/chat/completions"
ADMIN = parse_control_plane_key("ops:Operators:admin:admin-secret")
USER = parse_control_plane_key("dash:Dashboards:user:user-secret")


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def remote_client(state: GatewayState) -> httpx.AsyncClient:
    """A client whose peer address is not loopback (a name: no real address is needed)."""
    transport = httpx.ASGITransport(app=build_app(state), client=("peer.example.test", 4000))
    return httpx.AsyncClient(transport=transport, base_url="http://gateway.example.test")


def code_of(response: httpx.Response) -> str:
    return response.json()["error"]["code"]


async def test_api_key_guards_v1_and_names_the_tenant(
    qwen_meta_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state, _ = make_gateway(
        qwen_meta_dir,
        api_key="plain-secret",
        tenant_api_keys=[parse_tenant_key("acme:acme-secret")],
    )
    async with client(state) as http:
        for headers in ({}, bearer("wrong"), {"Authorization": "Basic plain-secret"}):
            refused = await http.post(CHAT, json=chat_body(), headers=headers)
            assert refused.status_code == 401, refused.text
            assert code_of(refused) == "invalid_api_key"
            assert refused.json()["error"]["type"] == "authentication_error"
            assert refused.headers["www-authenticate"] == "Bearer"
        assert (await http.get("/v1/models")).status_code == 401
        assert (await http.get("/v1/unknown")).status_code == 401  # no route list for strangers
        assert (await http.post(CHAT, json=chat_body(), headers=bearer("plain-secret"))).is_success
        with caplog.at_level(logging.INFO, logger="tandem.gateway.access"):
            answer = await http.post(CHAT, json=chat_body(), headers=bearer("acme-secret"))
        assert answer.status_code == 200
        (line,) = [r.getMessage() for r in caplog.records if r.name == "tandem.gateway.access"]
        assert " tenant=acme " in line
        # Open without a key: health, metrics and the API description.
        assert (await http.get("/health")).status_code in (200, 503)  # 503: no worker here
        assert (await http.get("/metrics")).status_code == 200
        assert (await http.get("/openapi.json")).status_code == 200


async def test_control_plane_roles(qwen_meta_dir: Path) -> None:
    state, _ = make_gateway(qwen_meta_dir, host="0.0.0.0", control_plane_api_keys=[ADMIN, USER])
    async with remote_client(state) as http:
        assert (await http.get("/workers", headers=bearer("user-secret"))).status_code == 200
        assert (await http.get("/workers", headers=bearer("admin-secret"))).status_code == 200
        for headers in ({}, bearer("wrong")):
            refused = await http.get("/workers", headers=headers)
            assert refused.status_code == 401 and code_of(refused) == "invalid_api_key"
        for call in (
            http.post("/workers", json={"url": "127.0.0.1:1"}, headers=bearer("user-secret")),
            http.delete("/workers", params={"url": "x:1"}, headers=bearer("user-secret")),
        ):
            forbidden = await call
            assert forbidden.status_code == 403 and code_of(forbidden) == "permission_denied"
            assert forbidden.json()["error"]["type"] == "permission_error"
        missing = await http.delete(
            "/workers", params={"url": "x:1"}, headers=bearer("admin-secret")
        )
        assert missing.status_code == 404 and code_of(missing) == "worker_not_found"
    # With keys configured, a loopback client needs one too.
    async with client(state) as http:
        assert (await http.get("/workers")).status_code == 401  # even from loopback


async def test_without_keys_only_loopback_clients_of_a_loopback_gateway(
    qwen_meta_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state, _ = make_gateway(qwen_meta_dir)
    async with client(state) as http:  # peer 127.0.0.1
        assert (await http.get("/workers")).status_code == 200
    async with remote_client(state) as http:
        refused = await http.get("/workers")
        assert refused.status_code == 403 and code_of(refused) == "admin_api_disabled"
        assert (await http.post(CHAT, json=chat_body())).status_code == 200  # no --api-key
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]

    exposed, _ = make_gateway(qwen_meta_dir, host="0.0.0.0")
    with caplog.at_level(logging.WARNING, logger="tandem.gateway"):
        http = client(exposed)  # builds the app: the start-up warning
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "/workers" in warnings[0], warnings
    async with http:
        for call in (http.get("/workers"), http.post("/workers", json={"url": "127.0.0.1:1"})):
            refused = await call
            assert refused.status_code == 403 and code_of(refused) == "admin_api_disabled"
        assert (await http.get("/health")).status_code in (200, 503)


async def _chunks(total: int) -> AsyncIterator[bytes]:
    for _ in range(total // 1000):
        yield b" " * 1000


@pytest.mark.parametrize(
    ("content", "status"),
    [
        (b"[]", 400),
        (b'"127.0.0.1:1"', 400),
        (b"null", 400),
        (b"{not json", 400),
        (b'{"url": "\xff"}', 400),  # not UTF-8
        (b'{"url": 5}', 400),
        (b"{" + b" " * 5000 + b"}", 413),  # declared Content-Length over the limit
    ],
)
async def test_admin_body_checks(qwen_meta_dir: Path, content: bytes, status: int) -> None:
    state, _ = make_gateway(qwen_meta_dir)
    async with client(state) as http:
        answer = await http.post("/workers", content=content)
    assert answer.status_code == status, answer.text
    assert code_of(answer) == ("payload_too_large" if status == 413 else "invalid_request")
    assert len(state.registry) == 0


async def test_admin_body_streamed_past_the_limit_is_413(qwen_meta_dir: Path) -> None:
    state, _ = make_gateway(qwen_meta_dir)
    async with client(state) as http:
        answer = await http.post("/workers", content=_chunks(50_000))  # chunked, no length
    assert answer.status_code == 413 and code_of(answer) == "payload_too_large"
