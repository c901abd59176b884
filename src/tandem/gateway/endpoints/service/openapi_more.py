"""The OpenAPI description of the Messages API and the Conversations API (openapi.py
builds the rest of ``/openapi.json`` and merges these in).

Messages answers errors in Anthropic's shape (``http/render.py``), the other routes in
OpenAI's. A few Messages fields are taken only at the value that changes nothing
(``service_tier``, ``speed``, ``mcp_servers``, ``cache_control``;
``messages/schema.py``): the request model drops them before validation, so they are
added here with exactly the values accepted.
"""

from __future__ import annotations

from typing import Any

from tandem.gateway.endpoints.conversations.schema import (
    HONOURED_INCLUDES,
    MAX_LIST_LIMIT,
    AddItems,
    CreateConversation,
    UpdateConversation,
)
from tandem.gateway.endpoints.messages.schema import CountTokensRequest, MessagesRequest

REF = "#/components/schemas/{model}"
MESSAGES_MODELS = (MessagesRequest, CountTokensRequest)
CONVERSATION_MODELS = (CreateConversation, UpdateConversation, AddItems)

ANTHROPIC_ERROR: dict[str, Any] = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {
        "type": {"const": "error"},
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
        },
    },
}
# Taken only at these values, each of which asks for what every request gets.
MESSAGES_DO_NOTHING: dict[str, Any] = {
    "service_tier": {"enum": ["auto", "standard_only"]},
    "speed": {"const": "standard"},
    "mcp_servers": {"type": "array", "maxItems": 0},
    "cache_control": {
        "type": "object",
        "required": ["type"],
        "properties": {"type": {"const": "ephemeral"}},
    },
}
MESSAGES_STATUSES = {
    "400": "Invalid request (bad JSON, field, media or header)",
    "404": "Unknown model",
    "413": "Body or media above a configured limit",
    "429": "Admission control: queue full or in-flight media budget; see Retry-After",
    "500": "Worker or gateway failure",
    "502": "Upstream returned something unusable",
    "503": "No worker available, or the gateway is draining; see Retry-After",
    "504": "Request timeout",
}
CONVERSATION_STATUSES = {
    "400": "Invalid body or query parameter",
    "404": "No such conversation or item, or no history store",
    "413": "Body above the configured limit",
    "503": "The history store is unavailable",
}


def messages_schemas(schemas: dict[str, Any], model_id: str | None) -> None:
    """Finish the Messages request schemas in place: the do-nothing fields, the model."""
    for model in MESSAGES_MODELS:
        schema = schemas[model.__name__]
        schema["properties"].update(MESSAGES_DO_NOTHING)
        if model_id is not None:
            schema["properties"]["model"]["enum"] = [model_id]
    schemas["AnthropicError"] = ANTHROPIC_ERROR


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _errors(statuses: dict[str, str], error_model: str) -> dict[str, Any]:
    body = _json({"$ref": REF.format(model=error_model)})
    return {status: {"description": text, "content": body} for status, text in statuses.items()}


def messages_paths() -> dict[str, Any]:
    """``POST /v1/messages`` (JSON or named SSE events) and its ``count_tokens``."""
    beta = {
        "name": "anthropic-beta",
        "in": "header",
        "required": False,
        "description": "Refused when present: Tandem implements no beta",
        "schema": {"type": "string", "maxLength": 0},
    }

    def op(summary: str, body: str, answer: dict[str, Any]) -> dict[str, Any]:
        return {
            "post": {
                "summary": summary,
                "parameters": [beta],
                "requestBody": {
                    "required": True,
                    "content": _json({"$ref": REF.format(model=body)}),
                },
                "responses": {
                    "200": {"description": summary, "content": answer},
                    **_errors(MESSAGES_STATUSES, "AnthropicError"),
                },
            }
        }

    event = {
        "type": "object",
        "required": ["data"],
        "properties": {"data": {"type": "string"}, "event": {"type": "string"}},
    }
    message = {**_json({"type": "object"}), "text/event-stream": {"schema": event}}
    counted = _json(
        {
            "type": "object",
            "required": ["input_tokens"],
            "properties": {"input_tokens": {"type": "integer", "minimum": 0}},
        }
    )
    return {
        "/v1/messages": op("Create a message (Anthropic)", "MessagesRequest", message),
        "/v1/messages/count_tokens": op(
            "Count a message's input tokens (Anthropic)", "CountTokensRequest", counted
        ),
    }


def conversation_paths() -> dict[str, Any]:
    """The Conversations API's routes (``conversations/route.py``)."""
    conversation = {
        "name": "conversation_id",
        "in": "path",
        "required": True,
        "schema": {"type": "string"},
    }
    item = {"name": "item_id", "in": "path", "required": True, "schema": {"type": "string"}}
    include = {
        "name": "include",
        "in": "query",
        "required": False,
        "schema": {"type": "array", "items": {"enum": list(HONOURED_INCLUDES)}},
    }
    page = [
        {
            "name": "limit",
            "in": "query",
            "required": False,
            "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIST_LIMIT},
        },
        {"name": "order", "in": "query", "required": False, "schema": {"enum": ["asc", "desc"]}},
        {"name": "after", "in": "query", "required": False, "schema": {"type": "string"}},
        include,
    ]

    def op(summary: str, params: list[dict[str, Any]], body: str | None = None) -> dict:
        operation: dict[str, Any] = {
            "summary": summary,
            "parameters": params,
            "responses": {
                "200": {"description": summary, "content": _json({"type": "object"})},
                **_errors(CONVERSATION_STATUSES, "Error"),
            },
        }
        if body is not None:
            ref = {"$ref": REF.format(model=body)}
            operation["requestBody"] = {
                "required": body != "CreateConversation",
                "content": _json(ref),
            }
        return operation

    one = "/v1/conversations/{conversation_id}"
    return {
        "/v1/conversations": {
            "post": op("Create a conversation", [], "CreateConversation"),
        },
        one: {
            "get": op("A conversation", [conversation]),
            "post": op("Update a conversation's metadata", [conversation], "UpdateConversation"),
            "delete": op("Delete a conversation", [conversation]),
        },
        f"{one}/items": {
            "get": op("A conversation's items", [conversation, *page]),
            "post": op("Add items to a conversation", [conversation, include], "AddItems"),
        },
        f"{one}/items/{{item_id}}": {
            "get": op("One item of a conversation", [conversation, item, include]),
            "delete": op("Delete an item of a conversation", [conversation, item]),
        },
    }
