"""SSE framing, and the openai SDK reading Tandem's streams and bodies (in-process ASGI)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tandem.errors import make_error
from tandem.gateway.endpoints.common.openai_bodies import (
    ChatChunkBuilder,
    ChoiceOutput,
    TextChunkBuilder,
    Usage,
    chat_completion,
)
from tandem.gateway.http.json_bodies import error_response
from tandem.gateway.http.sse import DONE, frame_events, sse_error_and_done, sse_event, sse_response


async def collect(stream: AsyncIterator[bytes]) -> list[bytes]:
    return [frame async for frame in stream]


async def from_list(events: list[Any], fail: Exception | None = None) -> AsyncIterator[Any]:
    for event in events:
        yield event
    if fail is not None:
        raise fail


def test_event_framing() -> None:
    assert sse_event({"a": "é", "b": [1, 2]}) == 'data: {"a":"é","b":[1,2]}\n\n'.encode()
    assert DONE == b"data: [DONE]\n\n"
    err = make_error("decode_stream_error", "worker went away")
    framed = sse_error_and_done(err)
    assert framed.endswith(DONE)
    payload = json.loads(framed[len(b"data: ") : -len(DONE)])
    assert payload == {
        "error": {
            "message": "worker went away",
            "type": "server_error",
            "param": None,
            "code": "decode_stream_error",
        }
    }


async def test_frame_events_ends_with_done() -> None:
    frames = await collect(frame_events(from_list([{"i": 1}, {"i": 2}])))
    assert frames == [b'data: {"i":1}\n\n', b'data: {"i":2}\n\n', DONE]


async def test_tandem_error_mid_stream_becomes_error_event() -> None:
    err = make_error("decode_stream_error", "leg failed")
    frames = await collect(frame_events(from_list([{"i": 1}], fail=err)))
    assert frames[0] == b'data: {"i":1}\n\n' and frames[-1] == DONE
    assert json.loads(frames[1][6:])["error"]["code"] == "decode_stream_error"


async def test_unexpected_error_is_internal_and_hides_its_text() -> None:
    frames = await collect(frame_events(from_list([], fail=RuntimeError("secret path /x"))))
    assert len(frames) == 2 and frames[-1] == DONE
    error = json.loads(frames[0][6:])["error"]
    assert error["code"] == "internal_error" and "secret" not in error["message"]


async def test_closing_the_stream_closes_the_producer_at_once() -> None:
    closed: list[bool] = []

    async def producer() -> AsyncIterator[dict[str, int]]:
        try:
            for i in range(100):
                yield {"i": i}
        finally:
            closed.append(True)  # where a real producer aborts its worker legs

    framed = frame_events(producer())
    assert await anext(framed) == b'data: {"i":0}\n\n'
    await framed.aclose()  # what the server does when the client disconnects
    assert closed == [True]


async def chat_stream(request: Request) -> Response:
    mode = request.query_params.get("mode", "ok")
    chunks = ChatChunkBuilder("chatcmpl-7", "m", 123, include_usage=True)

    async def events() -> AsyncIterator[dict[str, Any] | bytes]:
        for index in (0, 1):
            yield chunks.start(index)
        yield chunks.delta(0, "Hel")
        yield chunks.text_event(1, "漢")  # framed already, as the chat route sends text
        if mode == "fail":
            raise make_error("decode_stream_error", "decode worker died")
        yield chunks.text_event(0, "lo")
        yield chunks.finish(0, "stop")
        yield chunks.finish(1, "length")
        yield chunks.usage(Usage(prompt_tokens=4, completion_tokens=3, cached_tokens=2))

    return sse_response(events())


async def text_stream(request: Request) -> Response:
    chunks = TextChunkBuilder("cmpl-7", "m", 123)

    async def events() -> AsyncIterator[dict[str, Any] | bytes]:
        yield chunks.text_event(0, "once ")
        yield chunks.delta(0, "upon")
        yield chunks.finish(0, "length")

    return sse_response(events())


# Texts a tokenizer can hand over: JSON's escapes, controls, the mark text_event cuts at.
AWKWARD_TEXTS = [
    "",
    "plain",
    'quote " and \\ slash',
    "line\nbreak\ttab",
    "\x00",
    "a\x00b\x1f",
    "漢字 é",
    "\U0001f600",
    "\u2028\u2029",
    "</script>",
    "\x7f",
]


@pytest.mark.parametrize("usage", [False, True])
@pytest.mark.parametrize("make", [ChatChunkBuilder, TextChunkBuilder])
def test_a_framed_text_event_is_the_encoded_delta_byte_for_byte(make: Any, usage: bool) -> None:
    chunks = make("chatcmpl-7", "model-\u00e9", 123, include_usage=usage)
    for index in (0, 2, 0):
        for text in AWKWARD_TEXTS:
            framed = chunks.text_event(index, text)
            assert framed == sse_event(chunks.delta(index, text)), (index, text)
            assert json.loads(framed.removeprefix(b"data: "))["choices"][0]["index"] == index


def test_a_model_name_holding_the_mark_still_frames_its_text_exactly() -> None:
    chunks = ChatChunkBuilder("chatcmpl-7", "odd\x00model", 123)
    for text in AWKWARD_TEXTS:
        assert chunks.text_event(0, text) == sse_event(chunks.delta(0, text))


async def chat_json(request: Request) -> Response:
    return error_response(make_error("model_not_found", "no such model", param="model"))


APP = Starlette(
    routes=[
        Route("/v1/chat/completions", chat_stream, methods=["POST"]),
        Route("/v1/completions", text_stream, methods=["POST"]),
        Route("/bad/v1/chat/completions", chat_json, methods=["POST"]),
    ]
)


def sdk(base: str = "/v1", query: dict[str, str] | None = None) -> openai.AsyncOpenAI:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=APP), params=query)
    return openai.AsyncOpenAI(base_url=f"http://gw.test{base}", api_key="x", http_client=http)


async def test_sse_response_headers_and_body() -> None:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=APP)) as client:
        response = await client.post("http://gw.test/v1/completions", json={})
    assert response.headers["content-type"] == "text/event-stream"
    assert response.headers["cache-control"] == "no-cache"
    assert response.headers["x-accel-buffering"] == "no"
    frames = response.content.split(b"\n\n")
    assert frames[-2:] == [b"data: [DONE]", b""]
    assert all(f.startswith(b"data: ") for f in frames[:-1])


async def test_sdk_reads_chat_stream() -> None:
    stream = await sdk().chat.completions.create(model="m", messages=[], stream=True)
    text: dict[int, str] = {0: "", 1: ""}
    finish: dict[int, str | None] = {}
    roles, usage = set(), None
    async for chunk in stream:
        assert chunk.id == "chatcmpl-7" and chunk.object == "chat.completion.chunk"
        if chunk.usage is not None:
            assert chunk.choices == []
            usage = chunk.usage
        for choice in chunk.choices:
            roles.add(choice.delta.role)
            text[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finish[choice.index] = choice.finish_reason
    assert text == {0: "Hello", 1: "漢"} and finish == {0: "stop", 1: "length"}
    assert "assistant" in roles
    assert usage is not None and usage.total_tokens == 7
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == 2


async def test_sdk_raises_on_in_band_error() -> None:
    stream = await sdk(query={"mode": "fail"}).chat.completions.create(
        model="m", messages=[], stream=True
    )
    seen = []
    with pytest.raises(openai.APIError, match="decode worker died"):
        async for chunk in stream:
            seen.append(chunk)
    assert len(seen) == 4


async def test_sdk_reads_text_stream() -> None:
    stream = await sdk().completions.create(model="m", prompt="p", stream=True)
    chunks = [chunk async for chunk in stream]
    assert "".join(c.choices[0].text for c in chunks) == "once upon"
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.object == "text_completion" for c in chunks)


async def test_sdk_maps_error_response() -> None:
    with pytest.raises(openai.NotFoundError) as info:
        await sdk("/bad/v1").chat.completions.create(model="nope", messages=[])
    assert info.value.code == "model_not_found" and info.value.param == "model"


def test_chat_completion_body_shape() -> None:
    body = chat_completion(
        "chatcmpl-1", "m", 5, [ChoiceOutput(0, "hi", "stop")], Usage(2, 1, cached_tokens=1)
    )
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "hi"},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ]
    assert body["usage"] == {
        "prompt_tokens": 2,
        "completion_tokens": 1,
        "total_tokens": 3,
        "prompt_tokens_details": {"cached_tokens": 1},
    }
