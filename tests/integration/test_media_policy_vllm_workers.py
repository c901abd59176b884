"""One media policy in front of workers that do not enforce it (docs/operations.md, "Media
URLs and vLLM workers"), with real Tandem workers and real gateways on 127.0.0.1.

The "vLLM-style" worker is a real Tandem worker started with --test-only-advertise-as-vllm
(it leaves out the Tandem marker, as vLLM's servicer does) and with private media hosts
allowed, so that, like vLLM, it would follow a redirect anywhere. The media policy under
test allows the image server as "localhost" and refuses everything else, among them a
listener on 127.0.0.1 that counts connections: it must never see one.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import openai
import pytest

from tandem.errors import WORKER_ERROR_CODE_KEY

from .image_server import ConnectionCounter, ImageServer, png_bytes
from .processes import Proc, start_all
from .wire_helpers import chat_prompt_ids, generate, request, stats

MODEL = "tiny-qwen3-vl"
NULL = ["worker", "--engine", "null"]
POLICY = ["--mm-allow-private-media-hosts", "--mm-allowed-media-domains", "localhost"]


@pytest.fixture(scope="module")
def images():
    with ImageServer() as server:
        yield server


@pytest.fixture(scope="module")
def refused():
    with ConnectionCounter() as counter:
        yield counter


@pytest.fixture(scope="module")
def stack(model_cache: Path):
    vllm_like, tandem = start_all(
        [
            [*NULL, "--test-only-advertise-as-vllm", "--mm-allow-private-media-hosts"],
            [*NULL, *POLICY],
        ]
    )
    common = ["gateway", "--port", "0", "--mm-processing", "worker", *POLICY]
    common += ["--health-check-interval-secs", "600", "--max-retries", "0"]
    gateways = start_all(
        [
            [*common, "--worker-urls", vllm_like.address],
            [*common, "--worker-urls", tandem.address],
        ]
    )
    yield {
        "vllm_like": vllm_like,
        "tandem": tandem,
        "to_vllm_like": gateways[0],
        "to_tandem": gateways[1],
    }
    for proc in [*gateways, vllm_like, tandem]:
        proc.stop()


def chat(gateway: Proc, url: str, text: str = "What is this?"):
    client = openai.OpenAI(base_url=f"{gateway.address}/v1", api_key="unused", max_retries=0)
    parts = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": parts}], max_tokens=3
    )


def expect_error(gateway: Proc, url: str, code: str) -> None:
    with pytest.raises(openai.APIStatusError) as info:
        chat(gateway, url)
    assert info.value.status_code == 400, info.value.response.text
    assert info.value.response.json()["error"]["code"] == code


def leg(worker: Proc) -> dict[str, int]:
    """What reached the worker's Generate so far (requests, message bytes)."""
    counts = asyncio.run(stats(worker.address))
    aggregated = counts["leg_bytes"].get("aggregated", {"requests": 0, "message_bytes": 0})
    return {**aggregated, "media_items": counts["media_items_processed"]}


def test_a_vllm_style_worker_never_connects_to_a_refused_address(stack, images, refused) -> None:
    images.redirects["/hop.png"] = refused.url()
    before = leg(stack["vllm_like"])
    expect_error(
        stack["to_vllm_like"], images.path_url("/hop.png", "localhost"), "media_url_refused"
    )
    assert refused.connections == 0
    assert images.hits["/hop.png"] == 1  # the gateway's own guarded fetch, stopped at the hop
    assert leg(stack["vllm_like"])["requests"] == before["requests"]  # nothing was forwarded


def test_a_vllm_style_worker_is_sent_the_bytes_as_a_data_url(stack, images) -> None:
    before = leg(stack["vllm_like"])
    assert chat(stack["to_vllm_like"], images.url(3, "localhost")).choices
    after = leg(stack["vllm_like"])
    assert images.hits["/img/3.png"] == 1  # fetched once, by the gateway
    assert after["requests"] == before["requests"] + 1
    # The leg carried the image itself (base64), and the worker still processed it.
    assert after["message_bytes"] - before["message_bytes"] > len(png_bytes(3))
    assert after["media_items"] == before["media_items"] + 1


def test_a_tandem_worker_still_receives_the_url(stack, images, refused) -> None:
    before = leg(stack["tandem"])
    assert chat(stack["to_tandem"], images.url(4, "localhost")).choices
    after = leg(stack["tandem"])
    assert images.hits["/img/4.png"] == 1  # fetched once, by the worker
    assert after["message_bytes"] - before["message_bytes"] < 2000
    assert after["media_items"] == before["media_items"] + 1
    # ...and applies its own guard: the same redirect is refused there, with the same code.
    images.redirects["/hop2.png"] = refused.url()
    expect_error(stack["to_tandem"], images.path_url("/hop2.png", "localhost"), "media_url_refused")
    assert images.hits["/hop2.png"] == 1
    assert refused.connections == 0


async def test_the_worker_checks_anchors_before_fetching(stack, images, qwen_dir: Path) -> None:
    ids = chat_prompt_ids(qwen_dir, "<|image_pad|> is one placeholder too many", 1)
    url = images.url(5, "localhost")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await generate(stack["tandem"].address, request("anchors", ids, [url]))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    trailing = dict(info.value.trailing_metadata() or ())
    assert trailing.get(WORKER_ERROR_CODE_KEY) == "multimodal_prompt_contract_mismatch"
    assert images.hits["/img/5.png"] == 0
