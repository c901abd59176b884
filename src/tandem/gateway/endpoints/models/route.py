"""``GET /v1/models`` and ``GET /v1/models/{id}``: the served model, as OpenAI lists models."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tandem.errors import make_error
from tandem.gateway.http.json_bodies import json_response
from tandem.gateway.model import ModelHandle
from tandem.gateway.state import GatewayState


def model_routes(state: GatewayState) -> list[Route]:
    async def models(request: Request) -> Response:
        model = await state.ensure_model()
        data = [model_card(model)] if model is not None else []
        return json_response({"object": "list", "data": data})

    async def retrieve_model(request: Request) -> Response:
        model = await state.ensure_model()
        wanted = request.path_params["model_id"]
        if model is None or wanted != model.model_id:
            raise make_error("model_not_found", f"the model {wanted!r} does not exist")
        return json_response(model_card(model))

    return [
        Route("/v1/models", models, methods=["GET"]),
        # {model_id:path}: served names may hold slashes ("org/model"), as vLLM's do.
        Route("/v1/models/{model_id:path}", retrieve_model, methods=["GET"]),
    ]


def model_card(model: ModelHandle) -> dict[str, Any]:
    """A model as /v1/models lists it (OpenAI's fields, and vLLM's max_model_len)."""
    card: dict[str, Any] = {
        "id": model.model_id,
        "object": "model",
        "created": model.created,
        "owned_by": "tandem",
        "root": model.model_id,
    }
    if model.info.max_context:
        card["max_model_len"] = model.info.max_context
    return card
