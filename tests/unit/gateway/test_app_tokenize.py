"""``/tokenize`` and ``/detokenize`` through the real gateway app in-process (ASGI).

The tokenizer, chat template and image processor are the built-in models' own; the chat
requests compared against go through the real prompt and media stages, only the worker
side is scripted (gateway_app_fakes). A chat answer's ``prompt_tokens`` is the length of
the token ids the gateway put on the wire, so ``count`` must equal it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import jsonschema_rs
import pytest
from gateway_app_fakes import MODEL, chat_body, client, image_url, make_gateway

from tandem.gateway.auth import parse_tenant_key
from tandem.gateway.state import GatewayState
from tandem.media import MediaPolicy


@pytest.fixture(params=["qwen", "llava"])
def model_dir(request: pytest.FixtureRequest, qwen_meta_dir: Path, llava_meta_dir: Path) -> Path:
    return qwen_meta_dir if request.param == "qwen" else llava_meta_dir


def code_of(answer: httpx.Response) -> str:
    return answer.json()["error"]["code"]


async def tokenize(http: httpx.AsyncClient, path: str = "/tokenize", **body: Any) -> dict:
    answer = await http.post(path, json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()


async def prompt_tokens(http: httpx.AsyncClient, body: dict[str, Any]) -> int:
    answer = await http.post("/v1/chat/completions", json={**body, "max_tokens": 1})
    assert answer.status_code == 200, answer.text
    return answer.json()["usage"]["prompt_tokens"]


def idle(state: GatewayState) -> bool:
    return state.admission.running == 0 and state.pixel_budget.used == 0


async def test_a_prompt_is_tokenized_as_vllm_does(model_dir: Path) -> None:
    state, _ = make_gateway(model_dir)
    tokenizer = state.model.tokenizer
    async with client(state) as http:
        answer = await tokenize(http, model=MODEL, prompt="hello wörld", return_token_strs=True)
        expected = tokenizer.encode("hello wörld", add_special_tokens=True).ids
        assert answer["tokens"] == expected and answer["count"] == len(expected)
        assert answer["max_model_len"] == state.model.info.max_context
        # Vocabulary spellings, as vLLM's convert_ids_to_tokens gives them.
        assert answer["token_strs"] == [tokenizer.id_to_token(t) for t in expected]
        assert "Ġ" in answer["token_strs"]
        plain = await tokenize(http, "/v1/tokenize", prompt="hello wörld")
        assert plain["tokens"] == expected and plain["token_strs"] is None
        back = await http.post("/detokenize", json={"model": MODEL, "tokens": expected})
        assert back.status_code == 200 and back.json() == {"prompt": "hello wörld"}
        back = await http.post("/v1/detokenize", json={"tokens": []})
        assert back.json() == {"prompt": ""}


async def test_chat_counts_equal_the_chat_routes_prompt_tokens(model_dir: Path) -> None:
    state, _ = make_gateway(model_dir)
    info = state.model.info
    async with client(state) as http:
        for images in (0, 1, 2):
            body = chat_body(images=images)
            answer = await tokenize(http, model=MODEL, messages=body["messages"])
            assert answer["count"] == await prompt_tokens(http, body), images
            image_tokens = answer["tokens"].count(info.image_token_id)
            assert (image_tokens > images) if images else image_tokens == 0
            # Each image is its own run of image tokens, nothing is left unexpanded.
            if info.anchor_token_id != info.image_token_id:
                assert info.anchor_token_id not in answer["tokens"]
    assert idle(state)


async def test_the_count_follows_each_images_size(qwen_meta_dir: Path) -> None:
    """Qwen's token run depends on the image's size; the router path's own processing says."""
    state, _ = make_gateway(qwen_meta_dir)
    counts = []
    async with client(state) as http:
        for size in ((64, 48), (128, 96), (48, 160)):
            part = {"type": "image_url", "image_url": {"url": image_url(1, size)}}
            body = {"model": MODEL, "messages": [{"role": "user", "content": [part]}]}
            answer = await tokenize(http, **body)
            assert answer["count"] == await prompt_tokens(http, body)
            counts.append(answer["count"])
    assert len(set(counts)) == 3, counts


async def test_chat_options(qwen_meta_dir: Path) -> None:
    state, _ = make_gateway(qwen_meta_dir)
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure, "}]
    async with client(state) as http:
        body = chat_body()
        with_tools = await tokenize(http, messages=body["messages"], tools=[tool])
        plain = await tokenize(http, messages=body["messages"])
        assert with_tools["count"] > plain["count"]
        assert with_tools["count"] == await prompt_tokens(http, {**body, "tools": [tool]})
        opened = await tokenize(
            http, messages=messages, add_generation_prompt=False, continue_final_message=True
        )
        text = await http.post("/detokenize", json={"tokens": opened["tokens"]})
        assert text.json()["prompt"].endswith("<|im_start|>assistant\nSure, ")
        closed = await tokenize(http, messages=messages, add_generation_prompt=False)
        assert closed["count"] > opened["count"]
        assert closed["tokens"][: opened["count"]] == opened["tokens"]


@pytest.mark.parametrize(
    ("path", "body", "status", "code", "param"),
    [
        ("/tokenize", {"model": "other", "prompt": "x"}, 404, "model_not_found", "model"),
        ("/detokenize", {"model": "other", "tokens": [1]}, 404, "model_not_found", "model"),
        ("/detokenize", {"tokens": [1, 100000]}, 400, "invalid_request", "tokens"),
        ("/detokenize", {"tokens": [-1]}, 400, "invalid_request", "tokens.0"),
        ("/tokenize", {"prompt": "x", "messages": []}, 400, "invalid_request", "prompt"),
        (
            "/tokenize",
            {"messages": [{"role": "user", "content": "x"}], "chat_template": "{{ 1 }}"},
            400,
            "unsupported_parameter",
            "chat_template",
        ),
        (
            "/v1/tokenize",
            {"messages": [{"role": "user", "content": "x"}], "continue_final_message": True},
            400,
            "invalid_request",
            "continue_final_message",
        ),
    ],
)
async def test_errors_are_openai_error_json(
    qwen_meta_dir: Path, path: str, body: dict, status: int, code: str, param: str
) -> None:
    state, _ = make_gateway(qwen_meta_dir)
    async with client(state) as http:
        answer = await http.post(path, json=body)
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert (error["code"], error["param"]) == (code, param)


async def test_image_refusals_are_the_chat_routes(qwen_meta_dir: Path) -> None:
    policy = MediaPolicy(allowed_domains=("media.example.test",))
    state, dispatcher = make_gateway(qwen_meta_dir, media=policy, mm_per_request_image_limit=1)
    broken = "data:image/png;base64," + "A" * 64
    cases = [
        [image_url(0), image_url(1)],  # over --mm-per-request-image-limit
        ["http://elsewhere.example.test/a.png"],  # outside the allowed domains
        [broken],  # not an image
    ]
    async with client(state) as http:
        for urls in cases:
            parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
            messages = [{"role": "user", "content": parts}]
            chat = await http.post(
                "/v1/chat/completions", json={"model": MODEL, "messages": messages}
            )
            tokens = await http.post("/tokenize", json={"messages": messages})
            assert tokens.status_code == chat.status_code == 400, (tokens.text, chat.text)
            assert code_of(tokens) == code_of(chat), urls
        # Text that spells the placeholder itself cannot pair with the images.
        text = {"type": "text", "text": "<|image_pad|>"}
        messages = [{"role": "user", "content": [text]}]
        answer = await http.post("/tokenize", json={"messages": messages})
        assert answer.status_code == 200  # no image: the token is just text
        image = {"type": "image_url", "image_url": {"url": image_url(0)}}
        messages = [{"role": "user", "content": [image, text]}]
        answer = await http.post("/tokenize", json={"messages": messages})
        assert code_of(answer) == "multimodal_prompt_contract_mismatch"
    assert dispatcher.arrived == 0 and idle(state)


async def test_no_model_yet_is_a_503(qwen_meta_dir: Path) -> None:
    state, _ = make_gateway(qwen_meta_dir)
    state.model = None  # no --model-path and no worker registered
    async with client(state) as http:
        for path, body in (("/tokenize", {"prompt": "x"}), ("/detokenize", {"tokens": [1]})):
            answer = await http.post(path, json=body)
            assert (answer.status_code, code_of(answer)) == (503, "no_available_workers")


async def test_the_generation_routes_admission_applies(qwen_meta_dir: Path) -> None:
    """The chat route's gates (pipeline/gates.py): refused while draining, and a declared
    body over the limit is refused before it is read or queued."""
    state, _ = make_gateway(qwen_meta_dir, max_payload_size=1024)
    async with client(state) as http:
        big = await http.post("/tokenize", json={"prompt": "x" * 2000})
        state.draining = True
        for path, body in (("/tokenize", {"prompt": "x"}), ("/detokenize", {"tokens": [1]})):
            answer = await http.post(path, json=body)
            assert (answer.status_code, code_of(answer)) == (503, "shutting_down")
    assert (big.status_code, code_of(big)) == (413, "payload_too_large")
    assert state.admission.queued == 0 and state.admission.running == 0


async def test_the_routes_need_an_api_key_with_or_without_v1(qwen_meta_dir: Path) -> None:
    state, _ = make_gateway(
        qwen_meta_dir,
        api_key="plain-secret",
        tenant_api_keys=[parse_tenant_key("acme:acme-secret")],
    )
    bodies = {"tokenize": {"prompt": "x"}, "detokenize": {"tokens": [104]}}
    async with client(state) as http:
        for prefix in ("", "/v1"):
            for route, body in bodies.items():
                path = f"{prefix}/{route}"
                refused = await http.post(path, json=body)
                assert refused.status_code == 401, path
                assert code_of(refused) == "invalid_api_key"
                for key in ("plain-secret", "acme-secret"):
                    headers = {"Authorization": f"Bearer {key}"}
                    answer = await http.post(path, json=body, headers=headers)
                    assert answer.status_code == 200, (path, answer.text)
        # No route list for strangers below them either.
        assert (await http.post("/tokenize/x", json={})).status_code == 401


async def test_openapi_describes_both_routes(qwen_meta_dir: Path) -> None:
    state, _ = make_gateway(qwen_meta_dir)
    async with client(state) as http:
        doc = (await http.get("/openapi.json")).json()
        answer = await tokenize(http, messages=chat_body(images=1)["messages"])
    paths = {"/tokenize", "/v1/tokenize", "/detokenize", "/v1/detokenize"}
    assert paths <= set(doc["paths"])
    components = doc["components"]

    def valid(ref: dict[str, Any], value: Any) -> bool:
        return jsonschema_rs.validator_for({**ref, "components": components}).is_valid(value)

    post = doc["paths"]["/tokenize"]["post"]
    body = post["requestBody"]["content"]["application/json"]["schema"]
    assert valid(body, {"model": MODEL, "prompt": "x"})
    assert valid(body, {"messages": chat_body(images=1)["messages"], "return_token_strs": True})
    assert not valid(body, {"model": "other", "prompt": "x"})
    ok = post["responses"]["200"]["content"]["application/json"]["schema"]
    assert valid(ok, answer)
