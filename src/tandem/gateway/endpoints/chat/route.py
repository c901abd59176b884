"""``POST /v1/chat/completions``: the body converted, the pipeline's answer in chat's dialect."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tandem.gateway.endpoints.chat.render import chat_answer, chat_chunks
from tandem.gateway.endpoints.chat.schema import parse_chat_request
from tandem.gateway.http.inbound import HttpInbound
from tandem.gateway.http.render import ReleaseAfter, in_dialect, render
from tandem.gateway.pipeline.generation_request import GenerationRequest
from tandem.gateway.pipeline.run import Pipeline


def chat_generation(body: bytes) -> GenerationRequest:
    return parse_chat_request(body).generation()


def chat_routes(pipeline: Pipeline) -> list[Route]:
    async def chat(request: Request) -> Response | ReleaseAfter:
        outcome = await pipeline.run(HttpInbound(request), "chat", chat_generation)
        return render(in_dialect(outcome, chat_answer, chat_chunks))

    return [Route("/v1/chat/completions", chat, methods=["POST"])]
