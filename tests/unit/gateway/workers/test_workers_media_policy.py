"""The gateway in front of vLLM-protocol workers: the Tandem worker marker, the ``media_refs``
scheme check on the aggregated path (docs/pd-contract.md §5), and http(s) images forwarded as
``data:`` URLs to a worker that is not a Tandem worker.

The worker is the protocol-level fake of workers_fake_engine.py (real gRPC on 127.0.0.1,
canned answers, a record of every request it got): real vLLM cannot run in the unit suite,
and these tests read exactly what reached the worker. Real Tandem workers, one of them
started with --test-only-advertise-as-vllm, are in
tests/integration/test_media_policy_vllm_workers.py.
"""

from __future__ import annotations

import base64
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from workers_fake_engine import FakeEngineState, FakeEngineWorker

from tandem import __version__
from tandem.gateway.app import build_app
from tandem.gateway.backends.vllm.sender import VllmSender
from tandem.gateway.config import GatewayConfig
from tandem.gateway.model import ModelHandle
from tandem.gateway.state import GatewayState
from tandem.gateway.workers.registry import WorkerRegistry
from tandem.media import MediaPolicy
from tandem.wire.worker_marker import TANDEM_WORKER_LABEL
from tandem.worker.marker import TandemMarker

MODEL = "tiny-qwen3-vl"
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(200))  # never decoded: the fake worker echoes tokens


class _Origin(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.server.hits.append(self.path)  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(PNG)))
        self.end_headers()
        self.wfile.write(PNG)

    def log_message(self, *args: object) -> None:
        return


@pytest.fixture
def origin() -> Iterator[ThreadingHTTPServer]:
    """A loopback image origin that logs every path it serves."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Origin)
    server.hits = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def vision_state(schemes: str = "http,https,data") -> FakeEngineState:
    state = FakeEngineState()
    state.model_info.supports_vision = True
    state.server_info.mm_media_ref_schemes = schemes
    return state


@asynccontextmanager
async def fake_worker(state: FakeEngineState, *, tandem: bool) -> AsyncIterator[FakeEngineWorker]:
    worker = FakeEngineWorker(state, interceptors=[TandemMarker()] if tandem else [])
    await worker.start()
    try:
        yield worker
    finally:
        await worker.stop()


@asynccontextmanager
async def gateway(
    model_dir: Path, worker: FakeEngineWorker, **config: Any
) -> AsyncIterator[httpx.AsyncClient]:
    state = GatewayState(
        GatewayConfig(
            worker_urls=[worker.url], mm_processing="worker", health_interval_s=600, **config
        )
    )
    state.model = ModelHandle.from_dir(model_dir, MODEL)
    await state.start()
    transport = httpx.ASGITransport(app=build_app(state))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway.test") as c:
            yield c
    finally:
        await state.stop()


def chat(url: str) -> dict[str, Any]:
    parts = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "what?"}]
    return {"model": MODEL, "messages": [{"role": "user", "content": parts}], "max_tokens": 2}


@pytest.mark.parametrize("tandem", [False, True])
async def test_the_registry_tells_a_tandem_worker_by_its_marker(tandem: bool) -> None:
    async with fake_worker(vision_state(), tandem=tandem) as fake:
        registry = WorkerRegistry(sender=VllmSender())
        try:
            registered = await registry.add(fake.url)
        finally:
            await registry.close()
    assert registered.enforces_tandem_media_policy is tandem
    assert registered.labels.get(TANDEM_WORKER_LABEL) == (__version__ if tandem else None)
    # Everything else is the same GetServerInfo answer.
    assert registered.labels["server_type"] == "vllm-grpc"


async def test_aggregated_worker_path_checks_the_worker_media_ref_schemes(
    qwen_meta_dir: Path, tmp_path: Path
) -> None:
    image = tmp_path / "a.png"
    image.write_bytes(PNG)
    policy = MediaPolicy(allowed_local_path=tmp_path)
    state = vision_state("http,https,data")
    async with (
        fake_worker(state, tandem=True) as fake,
        gateway(qwen_meta_dir, fake, media=policy) as c,
    ):
        refused = await c.post("/v1/chat/completions", json=chat(image.as_uri()))
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["code"] == "media_ref_scheme_not_accepted"
        assert "'file'" in refused.json()["error"]["message"]
        assert state.generate_requests == []
        ok = await c.post("/v1/chat/completions", json=chat(f"data:image/png;base64,{'A' * 8}"))
        assert ok.status_code == 200, ok.text
    assert len(state.generate_requests) == 1


async def test_aggregated_worker_path_passes_a_scheme_the_worker_accepts(
    qwen_meta_dir: Path, tmp_path: Path
) -> None:
    image = tmp_path / "a.png"
    image.write_bytes(PNG)
    policy = MediaPolicy(allowed_local_path=tmp_path)
    state = vision_state("http,https,data,file")
    async with (
        fake_worker(state, tandem=True) as fake,
        gateway(qwen_meta_dir, fake, media=policy) as c,
    ):
        ok = await c.post("/v1/chat/completions", json=chat(image.as_uri()))
        assert ok.status_code == 200, ok.text
    assert [r.media_refs.items[0].url for r in state.generate_requests] == [image.as_uri()]


@pytest.mark.parametrize("tandem", [False, True])
async def test_only_a_tandem_worker_is_handed_the_url(
    qwen_meta_dir: Path, origin: ThreadingHTTPServer, tandem: bool
) -> None:
    url = f"http://127.0.0.1:{origin.server_address[1]}/a.png"
    policy = MediaPolicy(allow_private_hosts=True)
    state = vision_state()
    async with (
        fake_worker(state, tandem=tandem) as fake,
        gateway(qwen_meta_dir, fake, media=policy) as c,
    ):
        ok = await c.post("/v1/chat/completions", json=chat(url))
        assert ok.status_code == 200, ok.text
    (sent,) = [r.media_refs.items[0].url for r in state.generate_requests]
    if tandem:
        assert sent == url
        assert origin.hits == []  # type: ignore[attr-defined]  # the worker fetches it
    else:
        assert sent == "data:image/png;base64," + base64.b64encode(PNG).decode()
        assert origin.hits == ["/a.png"]  # type: ignore[attr-defined]


async def test_a_vllm_worker_without_data_refs_gets_a_clear_400(
    qwen_meta_dir: Path, origin: ThreadingHTTPServer
) -> None:
    url = f"http://127.0.0.1:{origin.server_address[1]}/a.png"
    policy = MediaPolicy(allow_private_hosts=True)
    state = vision_state("http,https")
    async with (
        fake_worker(state, tandem=False) as fake,
        gateway(qwen_meta_dir, fake, media=policy) as c,
    ):
        refused = await c.post("/v1/chat/completions", json=chat(url))
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["code"] == "media_ref_scheme_not_accepted"
    assert origin.hits == []  # type: ignore[attr-defined]
    assert state.generate_requests == []
