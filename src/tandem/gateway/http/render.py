"""A pipeline outcome as an HTTP answer: JSON, an SSE stream, or OpenAI error JSON.

Once a stream has started, errors arrive as an SSE error event (``http/sse.py``). Every
answer carries the request id, so a client can quote it against the logs. The Anthropic
Messages API (``/v1/messages*``) answers errors in Anthropic's body instead; its shape is
here because the edge (access control, unknown routes) needs it too, keyed by path.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.responses import Response

from tandem.errors import TandemError
from tandem.gateway.access_log import REQUEST_ID_HEADER
from tandem.gateway.http.json_bodies import error_response, json_response
from tandem.gateway.http.sse import sse_response
from tandem.gateway.pipeline.events import AnswerEvent, AnswerMeta, Completion
from tandem.gateway.pipeline.run import (
    Answered,
    Completed,
    Events,
    Failed,
    Gone,
    Outcome,
    PipelineOutcome,
    Streaming,
)


def in_dialect(
    outcome: PipelineOutcome,
    answer: Callable[[AnswerMeta, Completion], dict[str, Any]],
    chunks: Callable[
        [AnswerMeta, AsyncIterator[AnswerEvent]], AsyncIterator[dict[str, Any] | bytes]
    ],
) -> Outcome:
    """The pipeline's neutral answer rendered by one endpoint's ``answer`` and ``chunks``."""
    if isinstance(outcome, Completed):
        return Answered(answer(outcome.meta, outcome.answer), outcome.request_id)
    if isinstance(outcome, Events):
        return Streaming(chunks(outcome.meta, outcome.events), outcome.sent, outcome.request_id)
    return outcome


def render(
    outcome: Outcome, errors: Callable[[TandemError], Response] | None = None
) -> Response | ReleaseAfter:
    """The HTTP answer of a pipeline outcome, tagged with the request id; ``errors``
    renders a failure (default: OpenAI error JSON)."""
    if isinstance(outcome, Answered):
        response: Response = json_response(outcome.body)
    elif isinstance(outcome, Failed):
        response = (errors or coded_error_response)(outcome.error)
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


def coded_error_response(err: TandemError) -> Response:
    """OpenAI error JSON, with ``Retry-After`` when the error suggests one."""
    response = error_response(err)
    if err.retry_after is not None:
        response.headers["Retry-After"] = str(err.retry_after)
    return response


MESSAGES_PATH = "/v1/messages"

# Anthropic's error types by HTTP status (its SDK picks the exception class by status).
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def speaks_anthropic(path: str) -> bool:
    """Whether ``path`` belongs to the Messages API, whose errors take Anthropic's body."""
    return path == MESSAGES_PATH or path.startswith(MESSAGES_PATH + "/")


def anthropic_error_type(status: int) -> str:
    known = _ANTHROPIC_TYPES.get(status)
    if known is not None:
        return known
    return "api_error" if status >= 500 else "invalid_request_error"


def anthropic_error_body(err: TandemError) -> dict[str, Any]:
    """``{"type": "error", "error": {type, message}}``; the message starts with Tandem's
    stable code (and names the field), so operators can grep for it as on other routes."""
    where = f" (param '{err.param}')" if err.param else ""
    message = f"{err.code}: {err.message}{where}"
    return {
        "type": "error",
        "error": {"type": anthropic_error_type(err.status), "message": message},
    }


def anthropic_error_response(err: TandemError) -> Response:
    response = json_response(anthropic_error_body(err), status=err.status)
    if err.retry_after is not None:
        response.headers["Retry-After"] = str(err.retry_after)
    return response


def _tagged(response: Response, request_id: str) -> Response:
    """The request id on every answer, so a client can quote it against the logs."""
    response.headers[REQUEST_ID_HEADER] = request_id
    return response
