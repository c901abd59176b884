"""``POST /v1/completions``: the body converted, the answer in the legacy dialect."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tandem.gateway.endpoints.completions.render import completion_answer, completion_chunks
from tandem.gateway.endpoints.completions.schema import parse_completion_request
from tandem.gateway.http.inbound import HttpInbound
from tandem.gateway.http.render import ReleaseAfter, in_dialect, render
from tandem.gateway.pipeline.generation_request import GenerationRequest
from tandem.gateway.pipeline.run import Pipeline


def completion_generation(body: bytes) -> GenerationRequest:
    return parse_completion_request(body).generation()


def completion_routes(pipeline: Pipeline) -> list[Route]:
    async def completions(request: Request) -> Response | ReleaseAfter:
        outcome = await pipeline.run(HttpInbound(request), "completions", completion_generation)
        return render(in_dialect(outcome, completion_answer, completion_chunks))

    return [Route("/v1/completions", completions, methods=["POST"])]
