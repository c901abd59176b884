"""The whole gateway in front of a TensorRT-LLM stand-in worker, asked with the official
``openai`` client over real HTTP on 127.0.0.1: n = 2 as one request of two sequences
(streamed and not), the client's seed and stop token ids reaching the worker, logprobs,
"stop_word" answered as "stop", and an image sent as its bytes with its run expanded.

The worker is the scripted stand-in of trtllm_standin.py (real TensorRT-LLM needs CUDA);
Tandem's own worker behind this gateway is tests/integration/test_gateway_trtllm.py's.
"""

from __future__ import annotations

import asyncio
import base64
import io
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
import uvicorn
from PIL import Image
from trtllm_standin import StandinServer, StandinState, top_logprob

from tandem.gateway.app import build_app
from tandem.gateway.config import GatewayConfig
from tandem.gateway.model import ModelHandle
from tandem.gateway.multimodal.plan import plan_images
from tandem.gateway.multimodal.process import process_images
from tandem.gateway.server import bind
from tandem.gateway.state import GatewayState
from tandem.media import MediaPolicy

MODEL = "tiny-qwen3-vl"
TEXTS = ["alpha beta gamma", "delta epsilon"]


@asynccontextmanager
async def gateway(model_dir: Path, *worker_urls: str) -> AsyncIterator[openai.AsyncOpenAI]:
    state = GatewayState(
        GatewayConfig(backend="trtllm", worker_urls=list(worker_urls), health_interval_s=600)
    )
    state.model = ModelHandle.from_dir(model_dir, MODEL)
    await state.start()
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(build_app(state), log_level="warning", access_log=False, lifespan="off")
    )
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        async with openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0
        ) as api:
            yield api
    finally:
        server.should_exit = True
        await task
        await state.stop()


@pytest.fixture
def standin(qwen_meta_dir: Path) -> StandinState:
    model = ModelHandle.from_dir(qwen_meta_dir, MODEL)
    return StandinState(
        answers=[model.encode(t) for t in TEXTS],
        finish_reasons=["stop_word", "length"],
        prompt_tokens=9,
    )


def png() -> bytes:
    pixels = np.random.default_rng(3).integers(0, 256, size=(40, 48, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


MESSAGES: list[Any] = [{"role": "user", "content": "Count with me"}]


async def test_n_2_is_one_request_and_two_choices(
    qwen_meta_dir: Path, standin: StandinState
) -> None:
    async with StandinServer(standin) as worker, gateway(qwen_meta_dir, worker.url) as api:
        answer = await api.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            n=2,
            seed=11,
            max_tokens=20,
            logprobs=True,
            top_logprobs=2,
            extra_body={"stop_token_ids": [7]},
        )
    assert [c.message.content for c in answer.choices] == TEXTS
    assert [c.finish_reason for c in answer.choices] == ["stop", "length"]
    for i, choice in enumerate(answer.choices):
        assert choice.logprobs is not None and choice.logprobs.content is not None
        values = [t.logprob for t in choice.logprobs.content]
        assert values == [pytest.approx(top_logprob(i, p)) for p in range(len(values))]
        assert all(len(t.top_logprobs) == 2 for t in choice.logprobs.content)
    assert answer.usage is not None and answer.usage.prompt_tokens == 9
    [sent] = standin.requests
    config = sent.sampling_config
    assert config.num_return_sequences == 2 and config.beam_width == 1
    assert config.seed == 11 and list(sent.stop_token_ids) == [7]
    assert sent.output_config.logprobs == 2 and sent.max_tokens == 20
    assert not sent.streaming and list(sent.stop) == []


async def test_a_stream_of_two_sequences(qwen_meta_dir: Path, standin: StandinState) -> None:
    texts, reasons = ["", ""], [None, None]
    async with StandinServer(standin) as worker, gateway(qwen_meta_dir, worker.url) as api:
        stream = await api.chat.completions.create(
            model=MODEL, messages=MESSAGES, n=2, stream=True, max_tokens=20
        )
        async for chunk in stream:
            for choice in chunk.choices:
                texts[choice.index] += choice.delta.content or ""
                reasons[choice.index] = choice.finish_reason or reasons[choice.index]
    assert texts == TEXTS and reasons == ["stop", "length"]
    [sent] = standin.requests
    assert sent.streaming and sent.sampling_config.num_return_sequences == 2


async def test_an_image_goes_as_its_bytes(qwen_meta_dir: Path, standin: StandinState) -> None:
    image = png()
    url = "data:image/png;base64," + base64.b64encode(image).decode()
    parts: list[dict[str, Any]] = [
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": "What is this?"},
    ]
    async with StandinServer(standin) as worker, gateway(qwen_meta_dir, worker.url) as api:
        answer = await api.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": parts}], max_tokens=20
        )
    assert answer.choices[0].message.content == TEXTS[0]
    [sent] = standin.requests
    assert list(sent.multimodal_input.image_data) == [image]
    model = ModelHandle.from_dir(qwen_meta_dir, MODEL)
    assert model.processor is not None
    processed = await process_images(plan_images([url]), model.info, model.processor, MediaPolicy())
    [run] = processed.tokens_per_image
    ids = list(sent.tokenized.input_token_ids)
    image = model.info.image_token_id
    start = ids.index(image)
    assert run > 1 and ids[start : start + run] == [image] * run  # the anchor as its whole run
    assert ids.count(image) == run


async def test_an_image_request_is_retried_with_its_bytes(
    qwen_meta_dir: Path, standin: StandinState
) -> None:
    """The legs carry the images themselves (no pixels held beside them and sent once),
    so a worker failing before its first frame is retried on another, bytes and all."""
    image = png()
    url = "data:image/png;base64," + base64.b64encode(image).decode()
    parts: list[dict[str, Any]] = [
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": "What is this?"},
    ]
    standin.fail_generates = 1  # whichever worker is asked first fails
    async with (
        StandinServer(standin) as first,
        StandinServer(standin) as second,
        gateway(qwen_meta_dir, first.url, second.url) as api,
    ):
        answer = await api.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": parts}], max_tokens=20
        )
    assert answer.choices[0].message.content == TEXTS[0]
    failed, retried = standin.requests
    assert list(failed.multimodal_input.image_data) == [image]
    assert list(retried.multimodal_input.image_data) == [image]
    assert retried.request_id == f"{failed.request_id}-retry1"
