"""The gateway's OpenAPI description (``GET /openapi.json``), built from the request models.

The request bodies' schemas are the pydantic models' own JSON schema, so the description
cannot drift from what the parser accepts. Responses are described loosely (an object,
or an SSE stream) except errors, which always have the OpenAI error shape. The worker
admin API (``/workers``) is left out: it is for operators, not for API clients. The
Messages and Conversations routes are described in openapi_more.py.
"""

from __future__ import annotations

from typing import Any

from pydantic.json_schema import models_json_schema

from tandem.gateway.endpoints.chat.schema import ChatCompletionRequest
from tandem.gateway.endpoints.completions.schema import CompletionRequest
from tandem.gateway.endpoints.responses.request import ResponsesRequest
from tandem.gateway.endpoints.service.openapi_more import (
    CONVERSATION_MODELS,
    MESSAGES_MODELS,
    conversation_paths,
    messages_paths,
    messages_schemas,
)
from tandem.gateway.endpoints.tokenize.schema import (
    DetokenizeRequest,
    TokenizeChatRequest,
    TokenizePromptRequest,
)

_REF = "#/components/schemas/{model}"
# Refused on purpose (400 unsupported_content_part); not part of the described contract.
_UNDOCUMENTED = {"_UnsupportedPart", "_OtherPart", "_OtherItem", "_OtherTool"}
ERROR_STATUSES = {
    "400": "Invalid request (bad JSON, field, media or pairing)",
    "404": "Unknown model",
    "413": "Body or media above a configured limit",
    "429": "Admission control: queue full or in-flight media budget; see Retry-After",
    "500": "Worker or gateway failure",
    "502": "Upstream returned something unusable",
    "503": "No worker available, or the gateway is draining; see Retry-After",
    "504": "Request timeout",
}
ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": "string"},
            },
        }
    },
}
SSE_EVENT: dict[str, Any] = {
    "type": "object",
    "required": ["data"],
    "properties": {"data": {"type": "string"}, "event": {"type": "string"}},
}


def _strip_undocumented(node: Any) -> Any:
    """Drop every ``oneOf`` branch that points at an undocumented model."""
    if isinstance(node, dict):
        out = {k: _strip_undocumented(v) for k, v in node.items()}
        if "oneOf" in out:
            out["oneOf"] = [
                branch
                for branch in out["oneOf"]
                if not (
                    isinstance(branch, dict)
                    and branch.get("$ref", "").rsplit("/", 1)[-1] in _UNDOCUMENTED
                )
            ]
        return out
    if isinstance(node, list):
        return [_strip_undocumented(v) for v in node]
    return node


def _request_schemas(model_id: str | None) -> dict[str, Any]:
    _, top = models_json_schema(
        [
            (ChatCompletionRequest, "validation"),
            (CompletionRequest, "validation"),
            (ResponsesRequest, "validation"),
            *((model, "validation") for model in TOKENIZER_MODELS),
            *((model, "validation") for model in MESSAGES_MODELS),
            *((model, "validation") for model in CONVERSATION_MODELS),
        ],
        ref_template=_REF,
    )
    schemas = {k: v for k, v in top["$defs"].items() if k not in _UNDOCUMENTED}
    schemas = _strip_undocumented(schemas)
    if model_id is not None:
        # The one model this gateway serves; any other name is a 404.
        for name in ("ChatCompletionRequest", "CompletionRequest", "ResponsesRequest"):
            schemas[name]["properties"]["model"]["enum"] = [model_id]
        for model in TOKENIZER_MODELS:  # optional there: null means the served model
            schemas[model.__name__]["properties"]["model"] = {"enum": [model_id, None]}
    messages_schemas(schemas, model_id)
    schemas["Error"] = ERROR_SCHEMA
    return schemas


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _generation(summary: str, body: str) -> dict[str, Any]:
    error = {"$ref": _REF.format(model="Error")}
    responses: dict[str, Any] = {
        "200": {
            "description": "The completion (JSON), or with stream=true a server-sent event stream",
            "content": {
                **_json({"type": "object"}),
                # One schema per event: each is a JSON chunk, an error, or "[DONE]".
                "text/event-stream": {"schema": SSE_EVENT},
            },
        }
    }
    for status, text in ERROR_STATUSES.items():
        responses[status] = {"description": text, "content": _json(error)}
    return {
        "post": {
            "summary": summary,
            "requestBody": {"required": True, "content": _json({"$ref": _REF.format(model=body)})},
            "responses": responses,
        }
    }


def _get(summary: str, content: dict[str, Any], extra: dict[str, Any] | None = None) -> dict:
    responses = {"200": {"description": summary, "content": content}, **(extra or {})}
    return {"get": {"summary": summary, "responses": responses}}


def openapi_document(model_id: str | None, version: str) -> dict[str, Any]:
    """The OpenAPI 3.1 description of the client-facing routes."""
    any_object = _json({"type": "object"})
    unavailable = {"503": {"description": "No healthy worker, or draining", "content": any_object}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "Tandem gateway", "version": version},
        "paths": {
            "/v1/chat/completions": _generation("Chat completion", "ChatCompletionRequest"),
            "/v1/completions": _generation("Text completion", "CompletionRequest"),
            "/v1/responses": _generation("Create a response", "ResponsesRequest"),
            **_stored_response_paths(),
            "/v1/models": _get("The served model", any_object),
            "/v1/models/{model_id}": _model_path(any_object),
            "/health": _get("Healthy: workers available", any_object, unavailable),
            "/metrics": _get("Prometheus metrics", {"text/plain": {"schema": {"type": "string"}}}),
            **_tokenizer_paths(),
            **messages_paths(),
            **conversation_paths(),
        },
        "components": {"schemas": _request_schemas(model_id)},
    }


# /tokenize and /detokenize (gateway/endpoints/tokenize/route.py), each also under /v1.
TOKENIZER_MODELS = (TokenizeChatRequest, TokenizePromptRequest, DetokenizeRequest)
TOKENIZE_ANSWER: dict[str, Any] = {
    "type": "object",
    "required": ["count", "max_model_len", "tokens", "token_strs"],
    "properties": {
        "count": {"type": "integer", "minimum": 0},
        "max_model_len": {"type": "integer", "minimum": 0},
        "tokens": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        "token_strs": {"type": ["array", "null"], "items": {"type": "string"}},
    },
}
DETOKENIZE_ANSWER: dict[str, Any] = {
    "type": "object",
    "required": ["prompt"],
    "properties": {"prompt": {"type": "string"}},
}


def _tokenizer_op(summary: str, body: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    error = {"$ref": _REF.format(model="Error")}
    responses: dict[str, Any] = {"200": {"description": summary, "content": _json(answer)}}
    for status, text in ERROR_STATUSES.items():
        responses[status] = {"description": text, "content": _json(error)}
    return {
        "post": {
            "summary": summary,
            "requestBody": {"required": True, "content": _json(body)},
            "responses": responses,
        }
    }


def _tokenizer_paths() -> dict[str, Any]:
    either = {
        "oneOf": [
            {"$ref": _REF.format(model="TokenizeChatRequest")},
            {"$ref": _REF.format(model="TokenizePromptRequest")},
        ]
    }
    tokenize = _tokenizer_op("Tokens of a prompt or a chat", either, TOKENIZE_ANSWER)
    detokenize = _tokenizer_op(
        "Text of token ids",
        {"$ref": _REF.format(model="DetokenizeRequest")},
        DETOKENIZE_ANSWER,
    )
    paths: dict[str, Any] = {}
    for prefix in ("", "/v1"):
        paths[f"{prefix}/tokenize"] = tokenize
        paths[f"{prefix}/detokenize"] = detokenize
    return paths


def _model_path(content: dict[str, Any]) -> dict[str, Any]:
    """GET of one model by its id (the openai SDK's ``models.retrieve``)."""
    path = _get("One served model", content)
    path["get"]["parameters"] = [
        {"name": "model_id", "in": "path", "required": True, "schema": {"type": "string"}}
    ]
    path["get"]["responses"]["404"] = {
        "description": "No such model",
        "content": _json({"$ref": _REF.format(model="Error")}),
    }
    return path


def _stored_response_paths() -> dict[str, Any]:
    """GET/DELETE of a stored response and its input items (responses/service.py)."""
    error = {
        "description": "No such stored response",
        "content": _json({"$ref": _REF.format(model="Error")}),
    }
    param = {"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}
    page = [
        {"name": name, "in": "query", "required": False, "schema": schema}
        for name, schema in (
            ("limit", {"type": "integer", "minimum": 1, "maximum": 100}),
            ("order", {"enum": ["asc", "desc"]}),
            ("after", {"type": "string"}),
            ("before", {"type": "string"}),
        )
    ]

    def op(summary: str, params: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "summary": summary,
            "parameters": params,
            "responses": {
                "200": {"description": summary, "content": _json({"type": "object"})},
                "404": error,
            },
        }

    return {
        "/v1/responses/{response_id}": {
            "get": op("A stored response", [param]),
            "delete": op("Delete a stored response", [param]),
        },
        "/v1/responses/{response_id}/input_items": {
            "get": op("The input items of a stored response", [param, *page]),
        },
    }
