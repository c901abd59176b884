"""A parsed chat stream (tools, reasoning) still ends the worker stream when every choice is done.

The worker side is scripted (a fake, as in the other ``test_app_*`` files) so that the test
can count how many frames the gateway read.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import openai
from gateway_app_fakes import MODEL, ScriptedDispatcher, make_gateway

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
        return OpenedStream(self._counted(), lambda ok: None)

    async def _counted(self) -> AsyncIterator[pb.GenerateResponse]:
        for token in self.tokens:
            self.sent += 1
            yield pb.GenerateResponse(chunk=pb.GenerateStreamChunk(token_ids=[token]))
        self.sent += 1
        yield pb.GenerateResponse(complete=pb.GenerateComplete(finish_reason="length"))


async def test_a_stop_string_ends_a_parsed_stream_early(qwen_dir: Path) -> None:
    state, _ = make_gateway(qwen_dir)
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
