"""The Conversations API's routes (OpenAI's paths, as the openai SDK's ``conversations``
and ``conversations.items`` call them); the work is in service.py."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tandem.gateway.endpoints.conversations.service import ConversationsService
from tandem.gateway.http.access_control import tenant_of
from tandem.gateway.http.inbound import HttpInbound
from tandem.gateway.http.json_bodies import json_response
from tandem.gateway.state import GatewayState


def conversations_routes(state: GatewayState) -> list[Route]:
    service = ConversationsService(state)
    limit = state.config.max_payload_size

    async def body(request: Request) -> bytes:
        return await HttpInbound(request).read_body(limit)

    async def create(request: Request) -> Response:
        return json_response(await service.create(tenant_of(request), await body(request)))

    async def retrieve(request: Request) -> Response:
        cid = request.path_params["conversation_id"]
        return json_response(await service.retrieve(tenant_of(request), cid))

    async def update(request: Request) -> Response:
        cid = request.path_params["conversation_id"]
        return json_response(await service.update(tenant_of(request), cid, await body(request)))

    async def delete(request: Request) -> Response:
        cid = request.path_params["conversation_id"]
        return json_response(await service.delete(tenant_of(request), cid))

    async def list_items(request: Request) -> Response:
        cid = request.path_params["conversation_id"]
        page = await service.list_items(tenant_of(request), cid, request.query_params)
        return json_response(page)

    async def add_items(request: Request) -> Response:
        cid = request.path_params["conversation_id"]
        raw = await body(request)
        return json_response(
            await service.add_items(tenant_of(request), cid, raw, request.query_params)
        )

    async def get_item(request: Request) -> Response:
        cid, item_id = request.path_params["conversation_id"], request.path_params["item_id"]
        item = await service.get_item(tenant_of(request), cid, item_id, request.query_params)
        return json_response(item)

    async def delete_item(request: Request) -> Response:
        cid, item_id = request.path_params["conversation_id"], request.path_params["item_id"]
        return json_response(await service.delete_item(tenant_of(request), cid, item_id))

    one = "/v1/conversations/{conversation_id}"
    return [
        Route("/v1/conversations", create, methods=["POST"]),
        Route(one, retrieve, methods=["GET"]),
        Route(one, update, methods=["POST"]),
        Route(one, delete, methods=["DELETE"]),
        Route(one + "/items", list_items, methods=["GET"]),
        Route(one + "/items", add_items, methods=["POST"]),
        Route(one + "/items/{item_id}", get_item, methods=["GET"]),
        Route(one + "/items/{item_id}", delete_item, methods=["DELETE"]),
    ]
