"""A parsed chat stream (tools, reasoning) still ends the worker stream when every choice is done.

The worker side is scripted (a fake, as in the other ``test_app_*`` files) so that the test
can count how many frames the gateway read.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import openai
import pytest
from gateway_app_fakes import (
    MODEL,
    ScriptedDispatcher,
    client,
    make_gateway,
    read_wire,
    sse_chunks,
)

from tandem.gateway.app import build_app
from tandem.gateway.context import RequestContext
from tandem.gateway.dispatch.streams import OpenedStream
from tandem.gateway.model import ModelHandle
from tandem.wire.proto import pb

TOOLS = [{"type": "function", "function": {"name": "noop"}}]


class CountingWorker(ScriptedDispatcher):
    def __init__(self, model: ModelHandle, text: str) -> None:
        super().__init__(model, text)
        self.sent = 0

    async def open(self, ctx: RequestContext) -> OpenedStream:
        await super().open(ctx)
        return OpenedStream(read_wire(self._counted()), lambda ok: None)

    async def _counted(self) -> AsyncIterator[pb.GenerateResponse]:
        for token in self.tokens:
            self.sent += 1
            yield pb.GenerateResponse(chunk=pb.GenerateStreamChunk(token_ids=[token]))
        self.sent += 1
        yield pb.GenerateResponse(complete=pb.GenerateComplete(finish_reason="length"))


async def test_a_stop_string_ends_a_parsed_stream_early(qwen_meta_dir: Path) -> None:
    state, _ = make_gateway(qwen_meta_dir)
    worker = CountingWorker(state.model, "hello there, a long answer")
    state.dispatcher = worker
    transport = httpx.ASGITransport(app=build_app(state))
    http = httpx.AsyncClient(transport=transport, base_url="http://gateway.test/v1")
    async with openai.AsyncOpenAI(
        base_url="http://gateway.test/v1", api_key="x", http_client=http, max_retries=0
    ) as client:
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Hi"}],
            tools=TOOLS,
            stop=["ll"],
            stream=True,
        )
        text, finish = [], None
        async for chunk in stream:
            text.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
    assert ("".join(text), finish) == ("he", "stop")
    # Read up to the frame that completed the stop string, not the whole answer.
    assert worker.sent <= 5 < len(worker.tokens)


class CutOff(ScriptedDispatcher):
    """Answers part of a call's arguments, then ends on the token limit."""

    async def _frames(self) -> AsyncIterator[pb.GenerateResponse]:
        for token in self.tokens:
            yield pb.GenerateResponse(chunk=pb.GenerateStreamChunk(token_ids=[token]))
        done = pb.GenerateComplete(finish_reason="length", completion_tokens=len(self.tokens))
        yield pb.GenerateResponse(complete=done)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_named_call_cut_by_max_tokens_is_a_call_either_way(
    qwen_meta_dir: Path, stream: bool
) -> None:
    """OpenAI and vLLM answer a tool_calls entry with the arguments so far; non-streamed
    they once came back as message.content, streamed as call deltas."""
    state, _ = make_gateway(qwen_meta_dir)
    state.dispatcher = CutOff(state.model, '{"city": "Par')
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "weather?"}],
        "tools": [tool],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "stream": stream,
    }
    async with client(state) as http:
        reply = await http.post("/v1/chat/completions", json=body)
    assert reply.status_code == 200, reply.text
    if stream:
        chunks = sse_chunks(reply.text)
        deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
        calls = [call for d in deltas for call in d.get("tool_calls") or []]
        content = "".join(d.get("content") or "" for d in deltas)
        name = calls[0]["function"]["name"]
        arguments = "".join(c["function"].get("arguments") or "" for c in calls)
        finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1]
    else:
        choice = reply.json()["choices"][0]
        (call,) = choice["message"]["tool_calls"]
        content = choice["message"]["content"] or ""
        name, arguments = call["function"]["name"], call["function"]["arguments"]
        finish = choice["finish_reason"]
    assert (name, arguments, content, finish) == ("get_weather", '{"city": "Par', "", "length")


def _calls_of(reply: httpx.Response, stream: bool) -> tuple[list[tuple[str, str]], str, str]:
    """(name, arguments) per call, the content and the finish reason, streamed or not."""
    if not stream:
        choice = reply.json()["choices"][0]
        message = choice["message"]
        calls = [
            (c["function"]["name"], c["function"]["arguments"])
            for c in message.get("tool_calls") or []
        ]
        return calls, message["content"] or "", choice["finish_reason"]
    chunks = [c for c in sse_chunks(reply.text) if c["choices"]]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    merged: dict[int, list[str]] = {}
    for delta in deltas:
        for call in delta.get("tool_calls") or []:
            entry = merged.setdefault(call["index"], ["", ""])
            entry[0] += call["function"].get("name") or ""
            entry[1] += call["function"].get("arguments") or ""
    content = "".join(d.get("content") or "" for d in deltas)
    calls = [(name, arguments) for name, arguments in (merged[i] for i in sorted(merged))]
    return calls, content, chunks[-1]["choices"][0]["finish_reason"]


REQUIRED_CUTS = {
    # Cut inside the second call's arguments: both calls, the second as far as written.
    "in arguments": (
        '[{"name": "noop", "parameters": {}}, {"name": "get_weather", "parameters": {"ci',
        [("noop", "{}"), ("get_weather", '{"ci')],
    ),
    # Cut between elements: the calls so far.
    "after a call": ('[{"name": "noop", "parameters": {}}, ', [("noop", "{}")]),
    # Cut before any name is complete: nothing was called, the text is content.
    "before a name": ('[{"name": "no', []),
}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("case", REQUIRED_CUTS)
async def test_a_required_array_cut_by_max_tokens_keeps_its_calls_either_way(
    qwen_meta_dir: Path, stream: bool, case: str
) -> None:
    """Non-streamed, a cut array once came back whole as message.content with no calls,
    while the stream had already sent call deltas: both now give the calls begun."""
    text, expected = REQUIRED_CUTS[case]
    state, _ = make_gateway(qwen_meta_dir)
    state.dispatcher = CutOff(state.model, text)
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "weather?"}],
        "tools": [*TOOLS, weather],
        "tool_choice": "required",
        "stream": stream,
    }
    async with client(state) as http:
        reply = await http.post("/v1/chat/completions", json=body)
    assert reply.status_code == 200, reply.text
    calls, content, finish = _calls_of(reply, stream)
    assert (calls, content, finish) == (expected, "" if expected else text, "length")
