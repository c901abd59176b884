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
        case.validate_response(response, checks=CHECKS)

    run()
    assert 500 not in seen, seen
    assert 200 in seen and 400 in seen, seen  # the run reached both sides of the parser
    assert state.admission.running == 0 and state.pixel_budget.used == 0
