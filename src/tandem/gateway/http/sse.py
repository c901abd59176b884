"""Server-sent events framing for streamed completions, the way OpenAI frames them.

Each event is one ``data: <json>`` line and a blank line; the stream always ends
with ``data: [DONE]``. A failure after the HTTP status has been sent can only be
reported in-band: an ``{"error": …}`` event, then ``[DONE]``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from typing import Any

from starlette.responses import StreamingResponse

from tandem.errors import TandemError, make_error, openai_error_body
from tandem.gateway.http.json_bodies import json_bytes

log = logging.getLogger("tandem.gateway.sse")

DONE = b"data: [DONE]\n\n"

# Content-Type is set by hand: Starlette would append "; charset=utf-8" to a text/* media
# type. X-Accel-Buffering stops nginx-style proxies from holding tokens back.
SSE_HEADERS: Mapping[str, str] = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}


def sse_event(obj: Any) -> bytes:
    return b"data: " + json_bytes(obj) + b"\n\n"


def sse_error(err: TandemError) -> bytes:
    """The in-band error event (not followed by ``[DONE]``; see :func:`sse_error_and_done`)."""
    return sse_event(openai_error_body(err))


def sse_error_and_done(err: TandemError) -> bytes:
    return sse_error(err) + DONE


def named_event(obj: Mapping[str, Any]) -> bytes:
    """A Responses API event: ``event: <type>`` then its data line (no ``[DONE]`` after)."""
    return b"event: " + str(obj["type"]).encode() + b"\ndata: " + json_bytes(obj) + b"\n\n"


def named_error(err: TandemError) -> bytes:
    """The Responses API's in-band ``error`` event."""
    event = {"type": "error", "code": err.code, "message": err.message, "param": err.param}
    return named_event(event)


async def frame_named_events(
    events: AsyncIterable[Mapping[str, Any] | bytes],
) -> AsyncIterator[bytes]:
    """:func:`frame_events` for the Responses API: named events, ``error`` on a failure."""
    try:
        try:
            async for event in events:
                yield event if isinstance(event, bytes) else named_event(event)
        except TandemError as err:
            yield named_error(err)
        except Exception:
            log.exception("stream failed mid-response")
            yield named_error(make_error("internal_error", "internal error while streaming"))
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()


async def frame_events(events: AsyncIterable[Mapping[str, Any] | bytes]) -> AsyncIterator[bytes]:
    """Frame each event dict (bytes are an event framed already), then ``[DONE]``; an
    exception becomes an error event.

    A :class:`TandemError` is sent as it is; any other exception is logged and sent
    as ``internal_error`` without its text (it may hold internals). Cancellation
    (client gone) is not caught. However this generator ends, ``events`` is closed
    at once, so a producer's cleanup (aborting worker legs) does not wait for GC.
    """
    try:
        try:
            async for event in events:
                yield event if isinstance(event, bytes) else sse_event(event)
        except TandemError as err:
            yield sse_error(err)
        except Exception:
            log.exception("stream failed mid-response")
            yield sse_error(make_error("internal_error", "internal error while streaming"))
        yield DONE
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()


def sse_response(
    events: AsyncIterable[Mapping[str, Any] | bytes], named: bool = False
) -> StreamingResponse:
    """A streaming response over event dicts: :func:`frame_events`, or named events."""
    framed = frame_named_events(events) if named else frame_events(events)
    return StreamingResponse(framed, headers=dict(SSE_HEADERS))
