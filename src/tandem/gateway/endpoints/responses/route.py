"""The Responses API's routes: create (through the pipeline), retrieve, delete, input items."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tandem.gateway.endpoints.responses.service import ResponsesService
from tandem.gateway.http.access_control import tenant_of
from tandem.gateway.http.inbound import HttpInbound
from tandem.gateway.http.json_bodies import json_response
from tandem.gateway.http.render import ReleaseAfter, render
from tandem.gateway.pipeline.run import Pipeline
from tandem.gateway.state import GatewayState


def responses_routes(state: GatewayState, pipeline: Pipeline) -> list[Route]:
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

    return [
        Route("/v1/responses", create_response, methods=["POST"]),
        Route("/v1/responses/{response_id}", get_response, methods=["GET"]),
        Route("/v1/responses/{response_id}", delete_response, methods=["DELETE"]),
        Route("/v1/responses/{response_id}/input_items", list_input_items, methods=["GET"]),
    ]
