"""``/v1/messages`` through the real app in-process (scripted worker side), with the official
anthropic SDK: answers, streams, errors in Anthropic's body, keys, count_tokens."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import httpx2
import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/unit/gateway: the shared fakes

from gateway_app_fakes import MODEL, image_url, make_gateway

from tandem.gateway.app import build_app
from tandem.gateway.auth import parse_tenant_key
from tandem.gateway.context import RequestContext
from tandem.gateway.dispatch.streams import OpenedStream
from tandem.gateway.state import GatewayState

BASE = "http://gateway.test"
HI = [{"role": "user", "content": "Say hello."}]


def sdk(state: GatewayState, **keys: Any) -> anthropic.AsyncAnthropic:
    transport = httpx2.ASGITransport(app=build_app(state))
    http = httpx2.AsyncClient(transport=transport, base_url=BASE)
    keys.setdefault("api_key", "secret")
    return anthropic.AsyncAnthropic(base_url=BASE, http_client=http, max_retries=0, **keys)


def raw(state: GatewayState) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=build_app(state)), base_url=BASE)


def record_requests(state: GatewayState) -> list[RequestContext]:
    """The contexts that reach the worker side, for comparing what two routes sent."""
    seen: list[RequestContext] = []
    dispatcher = state.dispatcher
    opened = dispatcher.open

    async def open_and_record(ctx: RequestContext) -> OpenedStream:
        seen.append(ctx)
        return await opened(ctx)

    dispatcher.open = open_and_record  # type: ignore[method-assign]
    return seen


def image_turn(text: str = "What is this?") -> list[dict[str, Any]]:
    data = image_url(3).split(",", 1)[1]
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}
    return [{"role": "user", "content": [image, {"type": "text", "text": text}]}]


async def test_a_message_is_the_chat_answer_and_sends_the_chat_request(
    qwen_meta_dir: Path,
) -> None:
    state, _ = make_gateway(qwen_meta_dir, api_key="secret")
    seen = record_requests(state)
    async with sdk(state) as client:
        message = await client.messages.create(
            model=MODEL, max_tokens=16, messages=image_turn(), extra_body={"temperature": 0}
        )
    chat = {
        "model": MODEL,
        "max_tokens": 16,
        "temperature": 0,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": image_url(3)}},
                    {"type": "text", "text": "What is this?"},
                ],
            }
        ],
    }
    async with raw(state) as http:
        answer = await http.post(
            "/v1/chat/completions", json=chat, headers={"Authorization": "Bearer secret"}
        )
    body = answer.json()
    assert message.id.startswith("msg_") and message.type == "message"
    assert message.role == "assistant" and message.model == MODEL
    assert [b.type for b in message.content] == ["text"]
    assert message.content[0].text == body["choices"][0]["message"]["content"] == "hello there"
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    assert message.usage.input_tokens == body["usage"]["prompt_tokens"]
    assert message.usage.output_tokens == body["usage"]["completion_tokens"]
    assert message.usage.cache_read_input_tokens == 0
    messages_ctx, chat_ctx = seen
    assert messages_ctx.prompt_ids == chat_ctx.prompt_ids
    assert messages_ctx.sampling == chat_ctx.sampling
    assert messages_ctx.route == "messages" and chat_ctx.route == "chat"


async def test_the_sdk_stream_gives_the_same_message_and_events_in_order(
    qwen_meta_dir: Path,
) -> None:
    state, _ = make_gateway(qwen_meta_dir)
    async with sdk(state) as client:
        whole = await client.messages.create(model=MODEL, max_tokens=16, messages=HI)
        async with client.messages.stream(model=MODEL, max_tokens=16, messages=HI) as stream:
            text = "".join([piece async for piece in stream.text_stream])
            final = await stream.get_final_message()
    assert text == final.content[0].text == whole.content[0].text  # type: ignore[union-attr]
    assert final.stop_reason == whole.stop_reason
    assert final.usage.input_tokens == whole.usage.input_tokens
    assert final.usage.output_tokens == whole.usage.output_tokens
    body = {"model": MODEL, "max_tokens": 16, "messages": HI, "stream": True}
    async with raw(state) as http:
        response = await http.post("/v1/messages", json=body)
    assert response.headers["content-type"] == "text/event-stream"
    names = [
        line[len("event: ") :] for line in response.text.splitlines() if line.startswith("event: ")
    ]
    data = [
        json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")
    ]
    assert [d["type"] for d in data] == names  # each event is named after its type
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    assert "[DONE]" not in response.text


async def test_keys_come_as_x_api_key_or_bearer_and_wrong_ones_are_anthropic_errors(
    qwen_meta_dir: Path,
) -> None:
    state, _ = make_gateway(
        qwen_meta_dir, api_key="secret", tenant_api_keys=[parse_tenant_key("acme:acme-key")]
    )
    async with sdk(state, api_key="secret") as client:  # x-api-key
        assert (await client.messages.create(model=MODEL, max_tokens=4, messages=HI)).content
    async with sdk(state, api_key=None, auth_token="acme-key") as client:  # Bearer
        assert (await client.messages.create(model=MODEL, max_tokens=4, messages=HI)).content
    async with sdk(state, api_key="wrong") as client:
        with pytest.raises(anthropic.AuthenticationError) as info:
            await client.messages.create(model=MODEL, max_tokens=4, messages=HI)
        with pytest.raises(anthropic.AuthenticationError):
            await client.messages.count_tokens(model=MODEL, messages=HI)
    assert info.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": info.value.body["error"]["message"]},  # type: ignore[index]
    }
    assert info.value.body["error"]["message"].startswith("invalid_api_key: ")  # type: ignore[index]
    async with raw(state) as http:
        # The OpenAI routes take x-api-key too, and keep OpenAI's error body.
        models = await http.get("/v1/models", headers={"x-api-key": "acme-key"})
        assert models.status_code == 200
        refused = await http.get("/v1/models", headers={"x-api-key": "nope"})
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"


async def test_errors_take_anthropic_shape_and_the_sdk_raises_the_matching_class(
    qwen_meta_dir: Path,
) -> None:
    state, dispatcher = make_gateway(qwen_meta_dir, max_payload_size=4096)
    async with sdk(state) as client:
        with pytest.raises(anthropic.NotFoundError) as missing:
            await client.messages.create(model="no-such-model", max_tokens=4, messages=HI)
        with pytest.raises(anthropic.BadRequestError) as refused:
            await client.messages.create(
                model=MODEL, max_tokens=4, messages=HI, extra_body={"logprobs": True}
            )
        with pytest.raises(anthropic.BadRequestError) as beta:
            await client.messages.create(
                model=MODEL,
                max_tokens=4,
                messages=HI,
                extra_headers={"anthropic-beta": "output-128k-2025-02-19"},
            )
        with pytest.raises(anthropic.RequestTooLargeError) as large:
            await client.messages.create(
                model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "x" * 5000}]
            )
        with pytest.raises(anthropic.BadRequestError) as thinking:
            await client.messages.create(
                model=MODEL,
                max_tokens=2048,
                messages=HI,
                thinking={"type": "enabled", "budget_tokens": 1024},
            )
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    assert missing.value.response.headers["x-request-id"].startswith("tandem-")
    assert missing.value.body["error"]["message"].startswith("model_not_found: ")  # type: ignore[index]
    for error, name in ((refused, "logprobs"), (beta, "anthropic-beta"), (thinking, "thinking")):
        detail = error.value.body["error"]  # type: ignore[index]
        assert detail["type"] == "invalid_request_error"
        assert detail["message"].startswith("unsupported_parameter: ") and name in detail["message"]
    assert large.value.body["error"]["type"] == "request_too_large"  # type: ignore[index]
    assert dispatcher.arrived == 0
    async with raw(state) as http:
        lost = await http.post("/v1/messages/batches", json={})
    assert lost.status_code == 404
    assert lost.json()["error"]["type"] == "not_found_error"


async def test_count_tokens_equals_the_usage_of_the_same_request(qwen_meta_dir: Path) -> None:
    state, _ = make_gateway(qwen_meta_dir)
    tools = [
        {
            "name": "weather",
            "description": "Forecast.",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
        }
    ]
    async with sdk(state, default_headers={"anthropic-version": "1999-01-01"}) as client:
        for messages, extra in ((HI, {}), (image_turn(), {}), (HI, {"tools": tools})):
            counted = await client.messages.count_tokens(
                model=MODEL, messages=messages, system="Be brief.", **extra
            )
            message = await client.messages.create(
                model=MODEL, max_tokens=4, messages=messages, system="Be brief.", **extra
            )
            assert counted.input_tokens == message.usage.input_tokens
        words = [{"role": "user", "content": [{"type": "text", "text": "What is this?"}]}]
        text_only = await client.messages.count_tokens(model=MODEL, messages=words)
        with_image = await client.messages.count_tokens(model=MODEL, messages=image_turn())
    # The image's anchor is expanded to its token run (more than the anchor and its frame).
    assert with_image.input_tokens > text_only.input_tokens + 3


async def fails_mid_stream(ctx: RequestContext) -> OpenedStream:
    from gateway_app_fakes import read_wire

    from tandem.errors import make_error
    from tandem.wire.proto import pb

    token = ctx.model.encode("hi")[0]

    async def frames() -> AsyncIterator[pb.GenerateResponse]:
        yield pb.GenerateResponse(chunk=pb.GenerateStreamChunk(token_ids=[token]))
        raise make_error("decode_stream_error", "the decode worker went away")

    return OpenedStream(read_wire(frames()), lambda ok: None)


async def test_a_failure_mid_stream_is_an_error_event_the_sdk_raises(qwen_meta_dir: Path) -> None:
    state, dispatcher = make_gateway(qwen_meta_dir)
    dispatcher.open = fails_mid_stream  # type: ignore[method-assign]
    async with sdk(state) as client:
        with pytest.raises(anthropic.APIStatusError) as info:
            async with client.messages.stream(model=MODEL, max_tokens=8, messages=HI) as stream:
                async for _ in stream:
                    pass
    assert "decode_stream_error" in str(info.value)
