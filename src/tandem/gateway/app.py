"""The HTTP front: OpenAI routes, health, metrics, worker admin. Thin by design.

A generation route parses nothing itself: it hands the request to the pipeline
(``pipeline/run.py``) and renders the outcome: JSON, an SSE stream, or OpenAI error JSON
(once a stream has started, errors arrive as an SSE error event).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tandem import __version__
from tandem.errors import TandemError, make_error
from tandem.gateway import metrics
from tandem.gateway.access_control import access_middleware, tenant_of
from tandem.gateway.access_log import REQUEST_ID_HEADER
from tandem.gateway.api.responses import error_response, json_response
from tandem.gateway.api.schemas import parse_chat_request, parse_completion_request
from tandem.gateway.api.sse import sse_response
from tandem.gateway.inbound import HttpInbound
from tandem.gateway.model import ModelHandle
from tandem.gateway.openapi import openapi_document
from tandem.gateway.pipeline.events import AnswerEvent, AnswerMeta, Completion
from tandem.gateway.pipeline.generation_request import GenerationRequest
from tandem.gateway.pipeline.run import (
    Answered,
    Completed,
    Events,
    Failed,
    Gone,
    Outcome,
    Pipeline,
    PipelineOutcome,
    Streaming,
)
from tandem.gateway.render_openai import (
    chat_answer,
    chat_chunks,
    completion_answer,
    completion_chunks,
)
from tandem.gateway.responses.service import ResponsesService
from tandem.gateway.state import GatewayState
from tandem.gateway.tokenize import tokenize_routes
from tandem.gateway.workers_admin import admin_routes

log = logging.getLogger("tandem.gateway")


def build_app(state: GatewayState) -> Starlette:
    pipeline = Pipeline(state)

    async def chat(request: Request) -> Response | ReleaseAfter:
        outcome = await pipeline.run(HttpInbound(request), "chat", _chat_generation)
        return render(in_dialect(outcome, chat_answer, chat_chunks))

    async def completions(request: Request) -> Response | ReleaseAfter:
        inbound = HttpInbound(request)
        outcome = await pipeline.run(inbound, "completions", _completion_generation)
        return render(in_dialect(outcome, completion_answer, completion_chunks))

    responses = ResponsesService(state, pipeline)

    async def create_response(request: Request) -> Response | ReleaseAfter:
        return render(await responses.create(HttpInbound(request)))

    async def get_response(request: Request) -> Response:
        response_id = request.path_params["response_id"]
        return json_response(await responses.retrieve(tenant_of(request), response_id))

    async def delete_response(request: Request) -> Response:
        response_id = request.path_params["response_id"]
        return json_response(await responses.delete(tenant_of(request), response_id))

    async def list_input_items(request: Request) -> Response:
        response_id = request.path_params["response_id"]
        page = await responses.input_items(tenant_of(request), response_id, request.query_params)
        return json_response(page)

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
        return Response(generate_latest(metrics.REGISTRY), media_type=CONTENT_TYPE_LATEST)

    async def not_found(request: Request, exc: Exception) -> Response:
        return error_response(make_error("not_found", f"no route {request.url.path}"))

    async def coded(request: Request, exc: Exception) -> Response:
        # A route without its own handling (e.g. /v1/models when the model files cannot
        # be loaded) still answers with its code, never a bare 500.
        assert isinstance(exc, TandemError)
        return _error_response(exc)

    routes = [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/responses", create_response, methods=["POST"]),
        Route("/v1/responses/{response_id}", get_response, methods=["GET"]),
        Route("/v1/responses/{response_id}", delete_response, methods=["DELETE"]),
        Route("/v1/responses/{response_id}/input_items", list_input_items, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        # {model_id:path}: served names may hold slashes ("org/model"), as vLLM's do.
        Route("/v1/models/{model_id:path}", retrieve_model, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", prometheus, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
        *admin_routes(state),
        *tokenize_routes(state),
    ]
    return Starlette(
        routes=routes,
        exception_handlers={404: not_found, TandemError: coded},
        middleware=access_middleware(state.config),  # API keys: gateway/auth.py
    )


def _chat_generation(body: bytes) -> GenerationRequest:
    return parse_chat_request(body).generation()


def _completion_generation(body: bytes) -> GenerationRequest:
    return parse_completion_request(body).generation()


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


def in_dialect(
    outcome: PipelineOutcome,
    answer: Callable[[AnswerMeta, Completion], dict[str, Any]],
    chunks: Callable[[AnswerMeta, AsyncIterator[AnswerEvent]], AsyncIterator[dict[str, Any]]],
) -> Outcome:
    """The pipeline's neutral answer rendered by one endpoint's ``answer`` and ``chunks``."""
    if isinstance(outcome, Completed):
        return Answered(answer(outcome.meta, outcome.answer), outcome.request_id)
    if isinstance(outcome, Events):
        return Streaming(chunks(outcome.meta, outcome.events), outcome.sent, outcome.request_id)
    return outcome


def render(outcome: Outcome) -> Response | ReleaseAfter:
    """The HTTP answer of a pipeline outcome, tagged with the request id."""
    if isinstance(outcome, Answered):
        response: Response = json_response(outcome.body)
    elif isinstance(outcome, Failed):
        response = _error_response(outcome.error)
    elif isinstance(outcome, Gone):
        return Response(status_code=499)  # nobody reads it; the access log says 499
    else:
        streamed = _tagged(sse_response(outcome.events, outcome.named), outcome.request_id)
        return ReleaseAfter(streamed, outcome.sent)
    return _tagged(response, outcome.request_id)


class ReleaseAfter:
    """An ASGI response that runs ``release`` once it has been sent, whatever happened.

    A generator's ``finally`` does not run if the generator never started (a client gone
    before the first byte); this wrapper's does, so an admission slot cannot leak.
    """

    def __init__(self, response: Response, release: Callable[[], Awaitable[None]]) -> None:
        self.response = response
        self.release = release

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await self.response(scope, receive, send)
        finally:
            await self.release()


def _error_response(err: TandemError) -> Response:
    response = error_response(err)
    if err.retry_after is not None:
        response.headers["Retry-After"] = str(err.retry_after)
    return response


def _tagged(response: Response, request_id: str) -> Response:
    """The request id on every answer, so a client can quote it against the logs."""
    response.headers[REQUEST_ID_HEADER] = request_id
    return response
