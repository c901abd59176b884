"""The real gateway app in-process (ASGI) over a scripted dispatcher, for fast HTTP tests.

The prompt, media and respond stages are the real ones (a built-in model directory gives
the tokenizer, template and image processor); only the worker side is replaced, so a
test decides exactly when a request is "at the worker" and what comes back.

Kept out of conftest.py under a unique module name so test modules can import it.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from PIL import Image

from tandem.errors import TandemError
from tandem.gateway.app import build_app
from tandem.gateway.backends.frames import Frame
from tandem.gateway.backends.vllm.frames import frame_of
from tandem.gateway.config import GatewayConfig
from tandem.gateway.context import RequestContext
from tandem.gateway.dispatch.streams import OpenedStream
from tandem.gateway.model import ModelHandle
from tandem.gateway.state import GatewayState
from tandem.wire.proto import pb

MODEL = "tiny-qwen3-vl"


class ScriptedDispatcher:
    """Answers every request with ``text``; ``gate`` (when set) holds requests at the worker."""

    def __init__(self, model: ModelHandle, text: str = "hello there") -> None:
        self.tokens = model.encode(text)
        self.gate: asyncio.Event | None = None
        self.arrived = 0  # requests that reached the worker side
        self.pixel_bytes: list[int] = []
        self.fail: TandemError | None = None

    async def open(self, ctx: RequestContext) -> OpenedStream:
        self.arrived += 1
        if ctx.pixels is not None:
            self.pixel_bytes.append(ctx.pixels.nbytes)
        if self.gate is not None:
            await self.gate.wait()
        ctx.pixels = None  # "sent", as the real dispatchers do
        if self.fail is not None:
            raise self.fail
        return OpenedStream(read_wire(self._frames()), lambda ok: None)

    async def _frames(self) -> AsyncIterator[pb.GenerateResponse]:
        for token in self.tokens:
            yield pb.GenerateResponse(chunk=pb.GenerateStreamChunk(token_ids=[token]))
        yield pb.GenerateResponse(
            complete=pb.GenerateComplete(finish_reason="stop", completion_tokens=len(self.tokens))
        )


async def read_wire(messages: AsyncIterator[pb.GenerateResponse]) -> AsyncIterator[Frame]:
    """A scripted worker's vLLM frames as the gateway's client reads them."""
    async for message in messages:
        yield frame_of(message)


def make_gateway(model_dir: Path, **config: Any) -> tuple[GatewayState, ScriptedDispatcher]:
    """A state with the model loaded and a scripted dispatcher (router-side media).

    Stored responses live in memory (that backend needs no start; the SQL ones are
    tested against real databases in tests/unit/gateway/history).
    """
    config.setdefault("history_backend", "memory")
    state = GatewayState(GatewayConfig(mm_processing="router", **config))
    state.model = ModelHandle.from_dir(model_dir, MODEL)
    dispatcher = ScriptedDispatcher(state.model)
    state.dispatcher = dispatcher
    return state, dispatcher


def client(state: GatewayState) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=build_app(state))
    return httpx.AsyncClient(transport=transport, base_url="http://gateway.example.test")


def image_url(seed: int = 0, size: tuple[int, int] = (64, 48)) -> str:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def chat_body(images: int = 0, stream: bool = False, **extra: Any) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [
        {"type": "image_url", "image_url": {"url": image_url(i)}} for i in range(images)
    ]
    parts.append({"type": "text", "text": "What is this?"})
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": parts}],
        "max_tokens": 8,
        "stream": stream,
        **extra,
    }


async def wait_until(predicate, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.005)


def sse_chunks(text: str) -> list[dict[str, Any]]:
    """The JSON chunks of a chat or completions SSE body, in order ([DONE] left out)."""
    return [
        json.loads(line[len("data: ") :])
        for line in text.splitlines()
        if line.startswith("data: {")
    ]
