"""The gateway in aggregated mode over real workers, driven by the official openai client."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import httpx
import openai
import pytest

from tandem.engine.builtin import resolve_model

from .image_server import ImageServer, png_bytes
from .processes import SINGLE_PROCESS, Proc, start_all

MODEL = "tiny-qwen3-vl"


@pytest.fixture(scope="module")
def images():
    with ImageServer() as server:
        yield server


@pytest.fixture(scope="module")
def stack(model_cache: Path):
    workers = start_all(
        [["worker", "--model", MODEL, "--mm-allow-private-media-hosts"] for _ in range(2)]
    )
    urls = [w.address for w in workers]
    common = ["gateway", "--port", "0", "--worker-urls", *urls, "--max-payload-size", "3000000"]
    gateways = start_all(
        [
            [
                *common,
                "--mm-allow-private-media-hosts",
                "--mm-processing",
                "router",
                "--policy",
                "round_robin",
            ],
            [*common, "--mm-allow-private-media-hosts", "--mm-processing", "worker"],
            # private media hosts refused (the default), on the gateway's own router path
            # and the model files come from a local directory instead of a worker
            [
                *common,
                # single_process: test_worker_admin_api adds and removes workers (the admin
                # API refuses that under --processes N > 1)
                *SINGLE_PROCESS,
                "--mm-processing",
                "router",
                "--mm-per-request-image-limit",
                "2",
                "--model-path",
                str(resolve_model(MODEL)),
            ],
        ]
    )
    yield {
        "workers": workers,
        "router": gateways[0],
        "worker_path": gateways[1],
        "strict": gateways[2],
    }
    for proc in gateways + workers:
        proc.stop()


def client(proc: Proc) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{proc.address}/v1", api_key="unused", max_retries=0)


def image_message(urls: list[str], text: str = "What is this?") -> list[dict]:
    parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


def data_url(seed: int) -> str:
    return "data:image/png;base64," + base64.b64encode(png_bytes(seed)).decode()


def chat(proc: Proc, messages: list[dict], **kw):
    kw.setdefault("max_tokens", 8)
    kw.setdefault("temperature", 0)
    return client(proc).chat.completions.create(model=MODEL, messages=messages, **kw)


def test_text_chat_and_usage(stack) -> None:
    answer = chat(stack["router"], [{"role": "user", "content": "Hello there"}])
    choice = answer.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason == "length"
    assert answer.usage.completion_tokens == 8 and answer.usage.prompt_tokens > 5
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + 8


def test_streaming_equals_non_streaming(stack) -> None:
    messages = image_message([data_url(3)])
    whole = chat(stack["router"], messages).choices[0].message.content
    stream = chat(stack["router"], messages, stream=True, stream_options={"include_usage": True})
    pieces, usage = [], None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
    assert "".join(pieces) == whole
    assert usage is not None and usage.completion_tokens == 8


def test_image_chat_over_http_and_n(stack, images) -> None:
    answer = chat(stack["router"], image_message([images.url(11)]), n=2)
    assert len(answer.choices) == 2
    assert answer.choices[0].message.content == answer.choices[1].message.content  # greedy
    other = chat(stack["router"], image_message([images.url(12)]))
    assert other.choices[0].message.content != answer.choices[0].message.content


def test_router_and_worker_paths_give_the_same_tokens(stack, images) -> None:
    for urls in ([images.url(21)], [images.url(22), data_url(23)]):
        via_router = chat(stack["router"], image_message(urls)).choices[0].message.content
        via_worker = chat(stack["worker_path"], image_message(urls)).choices[0].message.content
        assert via_router == via_worker


def test_stop_strings_cut_the_text(stack) -> None:
    messages = [{"role": "user", "content": "Tell me something"}]
    full = chat(stack["router"], messages, max_tokens=16).choices[0].message.content
    stop = full[5:8]
    assert stop and full.index(stop) <= 5
    cut = chat(stack["router"], messages, max_tokens=16, stop=[stop]).choices[0]
    assert cut.message.content == full[: full.index(stop)]
    assert cut.finish_reason == "stop"
    streamed = chat(stack["router"], messages, max_tokens=16, stop=[stop], stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert text == full[: full.index(stop)]


def test_text_completions_endpoint(stack) -> None:
    api = client(stack["strict"])
    # ignore_eos: the built-in model would end after a word or two (it knows pictures only).
    kw = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 5, "temperature": 0}
    answer = api.completions.create(**kw, extra_body={"ignore_eos": True})
    assert answer.object == "text_completion" and answer.choices[0].text
    assert answer.usage.completion_tokens == 5
    assert answer.choices[0].finish_reason == "length"
    streamed = api.completions.create(**kw, stream=True, extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].text for c in streamed if c.choices) == answer.choices[0].text


def test_worker_admin_api(stack) -> None:
    base = stack["strict"].address
    listed = httpx.get(f"{base}/workers").json()["workers"]
    assert len(listed) == 2
    url = listed[0]["url"]
    assert httpx.delete(f"{base}/workers", params={"url": url}).status_code == 200
    assert [w["url"] for w in httpx.get(f"{base}/workers").json()["workers"]] == [listed[1]["url"]]
    missing = httpx.delete(f"{base}/workers", params={"url": url})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "worker_not_found"
    added = httpx.post(f"{base}/workers", json={"url": url}, timeout=30)
    assert added.status_code == 201 and added.json()["labels"]["supports_vision"] == "true"
    assert len(httpx.get(f"{base}/workers").json()["workers"]) == 2
    bad_role = httpx.post(f"{base}/workers", json={"url": url, "role": "boss"})
    assert bad_role.status_code == 400 and bad_role.json()["error"]["param"] == "role"


def test_models_health_metrics(stack) -> None:
    api = client(stack["router"])
    listed = api.models.list().data
    assert [m.id for m in listed] == [MODEL] and listed[0].created > 1_700_000_000
    assert api.models.retrieve(MODEL) == listed[0]  # the openai SDK's GET /v1/models/{id}
    with pytest.raises(openai.NotFoundError) as missing:
        api.models.retrieve("no-such-model")
    assert missing.value.body["code"] == "model_not_found"
    base = stack["router"].address
    assert httpx.get(f"{base}/health").status_code == 200
    metrics = httpx.get(f"{base}/metrics").text
    assert "tandem_requests_total" in metrics and "tandem_mm_processing_total" in metrics
    workers = httpx.get(f"{base}/workers").json()["workers"]
    assert {w["labels"]["supports_vision"] for w in workers} == {"true"}


def expect_error(call, status: int, code: str) -> None:
    with pytest.raises(openai.APIStatusError) as info:
        call()
    assert info.value.status_code == status, info.value.response.text
    assert info.value.response.json()["error"]["code"] == code


def test_error_codes(stack, images) -> None:
    router, strict = stack["router"], stack["strict"]
    expect_error(
        lambda: client(router).chat.completions.create(
            model="nope", messages=[{"role": "user", "content": "hi"}]
        ),
        404,
        "model_not_found",
    )
    bad_type = httpx.post(
        f"{router.address}/v1/chat/completions",
        json={"model": MODEL, "messages": [], "max_tokens": "many"},
    )
    assert bad_type.status_code == 400 and bad_type.json()["error"]["code"] == "invalid_request"
    assert bad_type.json()["error"]["param"] == "max_tokens"
    unknown_field = chat(router, [{"role": "user", "content": "hi"}], extra_body={"zzz": 1})
    assert unknown_field.choices
    huge = httpx.post(f"{router.address}/v1/chat/completions", content=b"x" * 3_100_000)
    assert huge.status_code == 413 and huge.json()["error"]["code"] == "payload_too_large"
    expect_error(
        lambda: chat(router, image_message([data_url(1)], "<|image_pad|> twice")),
        400,
        "multimodal_prompt_contract_mismatch",
    )
    broken = images.url(1).replace("/img/1.png", "/missing")
    expect_error(lambda: chat(router, image_message([broken])), 400, "multimodal_processing_failed")
    expect_error(lambda: chat(strict, image_message([images.url(2)])), 400, "media_url_refused")
    expect_error(
        lambda: chat(strict, image_message([data_url(i) for i in range(3)])),
        400,
        "multimodal_too_many_items",
    )
    assert images.hits[broken.split(":", 2)[2][5:]] == 1  # fetched once; the refused URL: never
    assert images.hits["/img/2.png"] == 0


def test_prefix_cache_keeps_images_apart(stack) -> None:
    """Cache-aware routing over two workers. Same text and image again: routed to the worker
    that holds its KV, and served from its prefix cache. Same text with another image of the
    same size: only the text before the image may be reused."""
    gateway, kw = stack["strict"], {"max_tokens": 24}
    first = chat(gateway, image_message([data_url(31)], "Same words"), **kw)
    again = chat(gateway, image_message([data_url(31)], "Same words"), **kw)
    other = chat(gateway, image_message([data_url(32)], "Same words"), **kw)
    other_again = chat(gateway, image_message([data_url(32)], "Same words"), **kw)
    prompt = first.usage.prompt_tokens
    assert again.usage.prompt_tokens_details.cached_tokens >= prompt - 16
    assert other.usage.prompt_tokens_details.cached_tokens < 16  # the text before the image
    assert other_again.usage.prompt_tokens_details.cached_tokens >= prompt - 16
    # Pictures 31 and 32 differ in colour (image_server.shape_of): so must the answers.
    assert other.choices[0].message.content != first.choices[0].message.content
    assert again.choices[0].message.content == first.choices[0].message.content


async def test_client_disconnect_aborts_the_worker(stack) -> None:
    from .wire_helpers import stats

    async def aborts() -> int:
        total = 0
        for worker in stack["workers"]:
            total += (await stats(worker.address))["requests_by_outcome"].get("abort", 0)
        return total

    before = await aborts()
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Go on and on"}],
        "max_tokens": 3000,
        "ignore_eos": True,  # else the trained model's short reply may end before the hang-up
        "stream": True,
    }
    url = f"{stack['router'].address}/v1/chat/completions"
    async with (
        httpx.AsyncClient(timeout=30) as http,
        http.stream("POST", url, json=body) as response,
    ):
        async for line in response.aiter_lines():
            if line.startswith("data:"):
                break  # the worker's stream is open (the SSE body starts after it): hang up
    for _ in range(100):
        if await aborts() > before:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the worker was never told to abort")


def test_retry_moves_to_a_healthy_worker(stack) -> None:
    victim = stack["workers"][0]
    victim.stop()
    for i in range(4):
        answer = chat(stack["router"], [{"role": "user", "content": f"still there {i}?"}])
        assert answer.choices[0].message.content
