"""``GET /openapi.json``, and a schema-driven fuzz run (schemathesis) against the real app.

The app runs in-process over ASGI with the real parse, prompt, media and respond stages
and a scripted worker side. Media URLs can only name hosts under ``media.example.test``
and the system resolver is replaced, so no fuzzed URL ever reaches DNS or the network.
"""

from __future__ import annotations

from pathlib import Path

import jsonschema_rs
import pytest
import schemathesis
from gateway_app_fakes import MODEL, chat_body, client, make_gateway
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tandem.gateway.app import build_app
from tandem.media import MediaPolicy

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@pytest.fixture
def no_dns(monkeypatch: pytest.MonkeyPatch) -> None:
    async def refuse(host: str, port: int) -> list[str]:
        return []  # "resolved to no addresses": a clean 400, and nothing leaves the process

    monkeypatch.setattr("tandem.media.guard.system_resolver", refuse)


def gateway(model_dir: Path):
    policy = MediaPolicy(allowed_domains=("media.example.test",))
    return make_gateway(model_dir, media=policy, request_timeout_s=10.0)


async def test_openapi_describes_the_client_routes(qwen_meta_dir: Path) -> None:
    state, _ = gateway(qwen_meta_dir)
    async with client(state) as http:
        answer = await http.get("/openapi.json")
    assert answer.status_code == 200
    doc = answer.json()
    assert {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health"} <= set(doc["paths"])
    assert "/workers" not in doc["paths"]  # the admin API is not for clients
    schemas = doc["components"]["schemas"]
    assert schemas["ChatCompletionRequest"]["properties"]["model"]["enum"] == [MODEL]
    assert "_UnsupportedPart" not in schemas
    # What the official SDK sends is valid under the description.
    validator = jsonschema_rs.validator_for(
        {"$ref": "#/components/schemas/ChatCompletionRequest", "components": doc["components"]}
    )
    validator.validate(chat_body(images=1, stream=True))
    assert not validator.is_valid({"model": MODEL, "messages": [], "n": 0})


async def test_openapi_describes_messages_and_conversations(qwen_meta_dir: Path) -> None:
    state, _ = gateway(qwen_meta_dir)
    async with client(state) as http:
        doc = (await http.get("/openapi.json")).json()
    paths = doc["paths"]
    assert {
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/conversations",
        "/v1/conversations/{conversation_id}",
        "/v1/conversations/{conversation_id}/items",
        "/v1/conversations/{conversation_id}/items/{item_id}",
    } <= set(paths)
    assert set(paths["/v1/conversations/{conversation_id}"]) == {"get", "post", "delete"}
    # Messages errors are Anthropic's shape, the others OpenAI's.
    bad = paths["/v1/messages"]["post"]["responses"]["400"]["content"]["application/json"]
    assert bad["schema"]["$ref"].endswith("/AnthropicError")

    def valid(model: str, body: dict) -> bool:
        schema = {"$ref": f"#/components/schemas/{model}", "components": doc["components"]}
        return jsonschema_rs.validator_for(schema).is_valid(body)

    message = {"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    assert valid("MessagesRequest", message)
    # The do-nothing fields are described at the values the gateway takes, and only those.
    assert valid("MessagesRequest", {**message, "service_tier": "auto", "mcp_servers": []})
    assert valid("MessagesRequest", {**message, "cache_control": {"type": "ephemeral"}})
    assert not valid("MessagesRequest", {**message, "service_tier": "priority"})
    assert not valid("MessagesRequest", {**message, "container": "c1"})
    assert not valid("MessagesRequest", {**message, "model": "another-model"})
    assert not valid("MessagesRequest", {k: v for k, v in message.items() if k != "max_tokens"})
    assert valid("CountTokensRequest", {k: v for k, v in message.items() if k != "max_tokens"})
    item = {"type": "message", "role": "user", "content": "hello"}
    assert valid("CreateConversation", {"metadata": {"topic": "x"}, "items": [item]})
    assert not valid("AddItems", {"items": []})


async def test_openapi_messages_schema_matches_the_parser(qwen_meta_dir: Path) -> None:
    """What the description accepts the route accepts, and what it refuses is a 400."""
    state, _ = gateway(qwen_meta_dir)
    message = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    async with client(state) as http:
        doc = (await http.get("/openapi.json")).json()
        schema = {"$ref": "#/components/schemas/CountTokensRequest", **doc}
        validator = jsonschema_rs.validator_for(schema)
        count = {k: v for k, v in message.items() if k != "max_tokens"}
        for extra, accepted in (
            ({}, True),
            ({"service_tier": "standard_only"}, True),
            ({"speed": "standard"}, True),
            ({"speed": "fast"}, False),
            ({"mcp_servers": [{"url": "x"}]}, False),
            ({"temperature": 0.5}, False),  # a Messages field, but not count_tokens'
        ):
            body = {**count, **extra}
            answer = await http.post("/v1/messages/count_tokens", json=body)
            assert validator.is_valid(body) is accepted, extra
            assert (answer.status_code == 200) is accepted, (extra, answer.text)
            if not accepted:
                assert answer.status_code == 400 and answer.json()["type"] == "error"


@pytest.mark.fuzz
def test_schemathesis_finds_no_server_errors(qwen_meta_dir: Path, no_dns: None) -> None:
    state, _ = gateway(qwen_meta_dir)
    # The routes that take input; /health answers 503 here by design (no workers).
    schema = schemathesis.openapi.from_asgi("/openapi.json", build_app(state)).include(
        path_regex="^/v1/"
    )
    cases = schema.as_strategy(GenerationMode.POSITIVE) | schema.as_strategy(
        GenerationMode.NEGATIVE
    )
    seen: dict[int, int] = {}
    paths: set[str] = set()

    @settings(
        max_examples=200,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    @given(case=cases)
    def run(case) -> None:
        response = case.call()
        seen[response.status_code] = seen.get(response.status_code, 0) + 1
        paths.add(case.path)
        case.validate_response(response, checks=CHECKS)

    run()
    assert 500 not in seen, seen
    assert 200 in seen and 400 in seen, seen  # the run reached both sides of the parser
    # Every family of routes was fuzzed, the Anthropic and stored-object ones included.
    for family in ("/v1/chat/", "/v1/responses", "/v1/messages", "/v1/conversations"):
        assert any(path.startswith(family) for path in paths), (family, sorted(paths))
    assert state.admission.running == 0 and state.pixel_budget.used == 0
