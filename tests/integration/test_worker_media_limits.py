"""The worker's media_refs limits on a real worker, directly over gRPC and through a real
gateway (docs/operations.md, "Memory bounds for images"): more items than
``--mm-max-items`` is a 400, a request above ``--mm-max-decoded-bytes`` a 413, and a
worker at ``--mm-max-inflight`` answers UNAVAILABLE "worker is saturated…", which the
gateway reports as a 503 (and would retry on another worker).

The worker runs the null engine: the real worker process, media path and protocol, with
canned tokens instead of a model.
"""

from __future__ import annotations

import asyncio
import base64
import io
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
import openai
import pytest
from PIL import Image

from tandem.errors import WORKER_ERROR_CODE_KEY

from .gateway_probe import eventually
from .processes import Proc, start_all
from .wire_helpers import chat_prompt_ids, generate, healthy, request

MODEL = "tiny-qwen3-vl"
MiB = 1 << 20


def png(side: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (side, side), (10, 120, 240)).save(buffer, format="PNG")
    return buffer.getvalue()


def data_url(side: int) -> str:
    return "data:image/png;base64," + base64.b64encode(png(side)).decode()


class GatedImageServer:
    """A loopback origin whose answers wait until ``release()``: a fetch in progress."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.hits = 0
        server = self
        body = png(32)

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.hits += 1
                server.gate.wait(30)
                self.send_response(200)
                self.send_header("Content-Type", "image/png")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                return

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/slow.png"

    def close(self) -> None:
        self.gate.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def procs(model_cache: Path) -> Iterator[dict[str, Proc]]:
    (worker,) = start_all(
        [
            [
                "worker",
                "--model",
                MODEL,
                "--engine",
                "null",
                "--mm-allow-private-media-hosts",
                "--mm-max-items",
                "2",
                "--mm-max-inflight",
                "1",
                "--mm-max-decoded-bytes",
                str(1 * MiB),
            ]
        ]
    )
    (gateway,) = start_all(
        [
            [
                "gateway",
                "--port",
                "0",
                "--worker-urls",
                worker.address,
                "--mm-processing",
                "worker",
                "--mm-allow-private-media-hosts",
                "--max-retries",
                "0",
                "--health-check-interval-secs",
                "600",
            ]
        ]
    )
    yield {"worker": worker, "gateway": gateway}
    gateway.stop()
    worker.stop()


def api(gateway: Proc) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"{gateway.address}/v1", api_key="unused", max_retries=0, timeout=60
    )


async def ask(gateway: Proc, *urls: str) -> tuple[int, str, str]:
    """(HTTP status, error code, message) of a chat completion with these image URLs."""
    parts: list[dict] = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    parts.append({"type": "text", "text": "What is it?"})
    async with api(gateway) as client:
        try:
            await client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": parts}],  # type: ignore[list-item]
                max_tokens=2,
            )
        except openai.APIStatusError as exc:
            body = exc.body if isinstance(exc.body, dict) else {}
            return exc.status_code, str(body.get("code") or ""), str(body.get("message") or "")
    return 200, "", ""


def refs_request(qwen_dir: Path, rid: str, *urls: str):
    return request(rid, chat_prompt_ids(qwen_dir, "hi", len(urls)), list(urls), max_tokens=2)


async def test_more_items_than_the_worker_takes_is_400(procs, qwen_dir: Path) -> None:
    status, code, message = await ask(procs["gateway"], *[data_url(16)] * 3)
    assert (status, code) == (400, "multimodal_too_many_items"), message
    assert "--mm-max-items" in message
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await generate(
            procs["worker"].address, refs_request(qwen_dir, "items", *[data_url(16)] * 3)
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    trailer = dict(info.value.trailing_metadata() or ())
    assert trailer.get(WORKER_ERROR_CODE_KEY) == "multimodal_too_many_items"
    assert (await ask(procs["gateway"], *[data_url(16)] * 2))[0] == 200


async def test_a_request_above_the_decoded_budget_is_413(procs) -> None:
    # 1024x1024 RGB is 4 MiB once decoded, over this worker's 1 MiB; charged from the
    # header, before a pixel is decoded.
    status, code, message = await ask(procs["gateway"], data_url(1024))
    assert (status, code) == (413, "multimodal_payload_too_large"), message
    assert "--mm-max-decoded-bytes" in message
    assert (await ask(procs["gateway"], data_url(64)))[0] == 200
    assert await healthy(procs["worker"].address)


async def test_a_saturated_worker_answers_unavailable_and_the_gateway_503(
    procs, qwen_dir: Path
) -> None:
    origin = GatedImageServer()
    try:
        # This request holds the worker's one media slot while its image is being fetched.
        holder = asyncio.ensure_future(ask(procs["gateway"], origin.url))
        await eventually(lambda: origin.hits)
        status, code, message = await ask(procs["gateway"], data_url(16))
        assert status == 503, (status, code, message)
        assert message.startswith("worker is saturated"), message
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await generate(procs["worker"].address, refs_request(qwen_dir, "busy", data_url(16)))
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "--mm-max-inflight=1" in (info.value.details() or "")
        origin.gate.set()
        assert (await asyncio.wait_for(holder, 30))[0] == 200
    finally:
        origin.close()
    assert (await ask(procs["gateway"], data_url(16)))[0] == 200  # the slot came back
