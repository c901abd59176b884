"""``/tokenize`` and ``/detokenize`` on a real gateway in front of real workers.

Per built-in model an aggregated worker and a gateway on the router media path (loopback
image hosts allowed, so the local image server can be fetched); for Qwen also a gateway on
the worker media path and one with the default media policy and an API key. The token ids
are checked against the model's own tokenizer, and a chat's ``count`` against the
``prompt_tokens`` the worker reports for the same messages sent to
``/v1/chat/completions`` (openai client), images included."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from tokenizers import Tokenizer

from tandem.engine.builtin import resolve_model

from .image_server import ImageServer, png_bytes
from .processes import Proc, start_all

pytestmark = pytest.mark.slow

MODELS = {"qwen": "tiny-qwen3-vl", "llava": "tiny-llava-1.5"}
KEY = "tokenize-secret"


@pytest.fixture(scope="module")
def images():
    with ImageServer() as server:
        yield server


@pytest.fixture(scope="module")
def gateways(model_cache: Path):
    # The workers may fetch loopback images too: the worker media path fetches them there.
    specs = [["worker", "--model", m, "--mm-allow-private-media-hosts"] for m in MODELS.values()]
    workers = dict(zip(MODELS, start_all(specs), strict=True))
    allow = ["--mm-allow-private-media-hosts"]
    qwen = ["--worker-urls", workers["qwen"].address]
    gateway = ["gateway", "--port", "0", "--mm-processing"]
    specs = {
        "qwen": [*gateway, "router", *allow, *qwen],
        "llava": [*gateway, "router", *allow, "--worker-urls", workers["llava"].address],
        "qwen-worker-path": [*gateway, "worker", *allow, *qwen],
        "strict": [*gateway, "router", "--api-key", KEY, *qwen],
    }
    procs = dict(zip(specs, start_all(list(specs.values())), strict=True))
    yield procs
    for proc in [*procs.values(), *workers.values()]:
        proc.stop()


def post(gateway: Proc, path: str, body: dict[str, Any], key: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{gateway.address}{path}", json=body, headers=headers, timeout=60)


def tokenize(gateway: Proc, path: str = "/tokenize", **body: Any) -> dict[str, Any]:
    answer = post(gateway, path, body)
    assert answer.status_code == 200, answer.text
    return answer.json()


def prompt_tokens(gateway: Proc, model: str, messages: list[dict[str, Any]]) -> int:
    api = openai.OpenAI(base_url=f"{gateway.address}/v1", api_key="x", max_retries=0)
    answer = api.chat.completions.create(model=model, messages=messages, max_tokens=1)
    assert answer.usage is not None
    return answer.usage.prompt_tokens


def data_url(seed: int, size: tuple[int, int] = (64, 48)) -> str:
    return "data:image/png;base64," + base64.b64encode(png_bytes(seed, size)).decode()


def with_image(url: str) -> list[dict[str, Any]]:
    parts = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "What?"}]
    return [{"role": "user", "content": parts}]


@pytest.mark.parametrize("family", MODELS)
def test_prompt_and_round_trip(gateways: dict[str, Proc], family: str) -> None:
    gateway, model = gateways[family], MODELS[family]
    tokenizer = Tokenizer.from_file(str(resolve_model(model) / "tokenizer.json"))
    text = "Tokens, please: naïve café ☕"
    answer = tokenize(gateway, model=model, prompt=text, return_token_strs=True)
    expected = tokenizer.encode(text, add_special_tokens=True).ids
    assert answer["tokens"] == expected and answer["count"] == len(expected)
    assert answer["max_model_len"] > 0
    assert answer["token_strs"] == [tokenizer.id_to_token(t) for t in expected]
    back = post(gateway, "/detokenize", {"model": model, "tokens": answer["tokens"]})
    assert back.status_code == 200 and back.json() == {"prompt": text}
    assert tokenize(gateway, "/v1/tokenize", prompt=text)["tokens"] == expected


@pytest.mark.parametrize("name", ["qwen", "llava", "qwen-worker-path"])
def test_chat_counts_equal_chat_completions(
    gateways: dict[str, Proc], images: ImageServer, name: str
) -> None:
    """On the worker media path the worker expands the images and reports the count."""
    gateway, model = gateways[name], MODELS[name.split("-")[0]]
    conversations = {
        "text": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hello there"},
        ],
        "data image": with_image(data_url(3)),
        "larger data image": with_image(data_url(4, (160, 120))),
        "http image": with_image(images.url(5)),
    }
    for what, messages in conversations.items():
        answer = tokenize(gateway, model=model, messages=messages)
        assert answer["count"] == prompt_tokens(gateway, model, messages), what
        text = post(gateway, "/detokenize", {"tokens": answer["tokens"]}).json()["prompt"]
        assert "Hello there" in text or "What?" in text


def test_errors(gateways: dict[str, Proc], images: ImageServer) -> None:
    gateway = gateways["qwen"]
    cases = [
        ("/tokenize", {"model": "nope", "prompt": "x"}, 404, "model_not_found", "model"),
        ("/detokenize", {"tokens": [5, 10**6]}, 400, "invalid_request", "tokens"),
        ("/tokenize", {"messages": []}, 400, "invalid_request", "messages"),
        (
            "/tokenize",
            {"messages": with_image(data_url(1)), "mm_processor_kwargs": {"max_pixels": 64}},
            400,
            "unsupported_parameter",
            "mm_processor_kwargs",
        ),
    ]
    for path, body, status, code, param in cases:
        answer = post(gateway, path, body)
        assert answer.status_code == status, answer.text
        error = answer.json()["error"]
        assert (error["code"], error["param"]) == (code, param)
    # The default media policy refuses a loopback image host here as chat does.
    strict = gateways["strict"]
    refused = post(strict, "/tokenize", {"messages": with_image(images.url(6))}, key=KEY)
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "media_url_refused"
    assert images.hits["/img/6.png"] == 0
    # An API key guards the routes outside /v1 too.
    assert post(strict, "/tokenize", {"prompt": "x"}).status_code == 401
    assert post(strict, "/detokenize", {"tokens": [104]}).status_code == 401
    assert post(strict, "/detokenize", {"tokens": [104]}, key=KEY).json() == {"prompt": "h"}
