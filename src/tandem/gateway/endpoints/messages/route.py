"""``POST /v1/messages`` (through the shared pipeline) and ``POST /v1/messages/count_tokens``.

Every error is Anthropic's body (``http/render.py``), so its SDK raises the class that
matches the status. Headers: ``anthropic-version`` is accepted whatever its value (the one
API shape Tandem speaks is the current one); ``anthropic-beta`` is refused by name, since
each beta changes what a request means and Tandem implements none of them.
"""

from __future__ import annotations

import logging

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tandem.errors import TandemError, make_error
from tandem.gateway.endpoints.messages.convert import generation
from tandem.gateway.endpoints.messages.count import count_tokens
from tandem.gateway.endpoints.messages.render import message_answer
from tandem.gateway.endpoints.messages.schema import parse_messages_request
from tandem.gateway.endpoints.messages.stream import message_events
from tandem.gateway.http.inbound import HttpInbound
from tandem.gateway.http.json_bodies import json_response
from tandem.gateway.http.render import (
    MESSAGES_PATH,
    ReleaseAfter,
    anthropic_error_response,
    in_dialect,
    render,
)
from tandem.gateway.pipeline.gates import admit
from tandem.gateway.pipeline.generation_request import GenerationRequest
from tandem.gateway.pipeline.run import ClientGone, Pipeline, Streaming
from tandem.gateway.state import GatewayState
from tandem.gateway.types import Route as RouteName

log = logging.getLogger("tandem.gateway.endpoints.messages")
# The access log's and metrics' route label.
MESSAGES_ROUTE: RouteName = "messages"


def beta_refusal(request: Request) -> TandemError | None:
    beta = request.headers.get("anthropic-beta")
    if beta is None or not beta.strip():
        return None
    return make_error(
        "unsupported_parameter",
        f"anthropic-beta '{beta}' is not supported by this gateway: remove the header",
        param="anthropic-beta",
    )


def messages_routes(state: GatewayState, pipeline: Pipeline) -> list[Route]:
    reasoning_parser = state.config.reasoning_parser

    def parse(body: bytes) -> GenerationRequest:
        return generation(parse_messages_request(body), reasoning_parser)

    async def messages(request: Request) -> Response | ReleaseAfter:
        refused = beta_refusal(request)
        if refused is not None:
            return anthropic_error_response(refused)
        outcome = await pipeline.run(HttpInbound(request), MESSAGES_ROUTE, parse)
        rendered = in_dialect(outcome, message_answer, message_events)
        if isinstance(rendered, Streaming):
            rendered.named = True  # event: <type> lines, no [DONE]
        return render(rendered, errors=anthropic_error_response)

    async def count(request: Request) -> Response:
        refused = beta_refusal(request)
        if refused is not None:
            return anthropic_error_response(refused)
        inbound = HttpInbound(request)
        slot = None
        try:
            # As /tokenize: rendering and image processing cost CPU, so they are admitted.
            slot = await admit(state, inbound)
            return json_response(await count_tokens(state, inbound))
        except TandemError as err:
            return anthropic_error_response(err)
        except ClientGone:
            return Response(status_code=499)  # nobody reads it
        except Exception:
            log.exception("unexpected failure on %s/count_tokens", MESSAGES_PATH)
            bug = make_error("internal_error", "internal error; see the gateway log")
            return anthropic_error_response(bug)
        finally:
            if slot is not None:
                slot.release()

    return [
        Route(MESSAGES_PATH, messages, methods=["POST"]),
        Route(f"{MESSAGES_PATH}/count_tokens", count, methods=["POST"]),
    ]
