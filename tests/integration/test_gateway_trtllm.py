"""Tandem's gateway in front of Tandem's TensorRT-LLM-protocol workers, with the openai
client.

Real `tandem worker --protocol trtllm` processes (real forward passes; each image sent as
its source bytes with the prompt's placeholder runs expanded, processed by the worker)
behind a gateway that finds the protocol itself (`--backend auto`). Every greedy answer is
compared with the same model behind the vLLM protocol: text, one and two images, n = 2,
logprobs, a JSON schema, stop strings. Real TensorRT-LLM engines need CUDA, so Tandem's
worker stands in for one here; tests/compat/test_smg_trtllm.py checks it against smg.
"""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import openai
import pytest

from tandem.engine.builtin_shapes import draw

from .gateway_probe import hang_up_at_first_data
from .image_server import png_bytes
from .processes import Proc, start_all
from .wire_helpers import stats

MODELS = {"qwen": "tiny-qwen3-vl", "llava": "tiny-llava-1.5"}
WORKERS = {
    "trt": ["--protocol", "trtllm"],
    "trt-lmo": ["--protocol", "trtllm", "--language-model-only"],
    "vllm": ["--protocol", "vllm"],
}


@pytest.fixture(scope="module")
def procs(model_cache: Path):
    names, specs = [], []
    for family, model in MODELS.items():
        for name, args in WORKERS.items():
            names.append(f"{family}-{name}")
            specs.append(["worker", "--model", model, *args])
    workers = dict(zip(names, start_all(specs), strict=True))
    gw_names = [f"{family}-{name}" for family in MODELS for name in WORKERS]
    gw_specs = [
        ["gateway", "--port", "0", "--worker-urls", workers[name].address] for name in gw_names
    ]
    gateways = dict(zip(gw_names, start_all(gw_specs), strict=True))
    yield {**workers, **{f"gw:{k}": v for k, v in gateways.items()}}
    for proc in [*gateways.values(), *workers.values()]:
        proc.stop()


def client(gateway: Proc) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.address}/v1", api_key="x", max_retries=0)


def image_url(seed: int) -> str:
    return "data:image/png;base64," + base64.b64encode(png_bytes(seed)).decode()


def messages(n_images: int, seed: int = 0, text: str = "What do you see?") -> list[dict]:
    parts = [
        {"type": "image_url", "image_url": {"url": image_url(seed + i)}} for i in range(n_images)
    ]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


def create(procs, name: str, family: str, msgs: list[dict], **fields: Any) -> Any:
    fields = {"max_tokens": 8, "temperature": 0, **fields}
    gateway = procs[f"gw:{family}-{name}"]
    return client(gateway).chat.completions.create(model=MODELS[family], messages=msgs, **fields)


def ask(procs, name: str, family: str, msgs: list[dict], **fields: Any) -> list[tuple[str, str]]:
    answer = create(procs, name, family, msgs, **fields)
    return [(c.message.content or "", c.finish_reason) for c in answer.choices]


def ask_streamed(procs, name: str, family: str, msgs: list[dict], **fields: Any) -> list[str]:
    n = fields.get("n", 1)
    texts = [""] * n
    for chunk in create(procs, name, family, msgs, stream=True, **fields):
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    return texts


@pytest.mark.parametrize("family", ["qwen", "llava"])
@pytest.mark.parametrize("n_images", [0, 1, 2])
def test_answers_equal_the_vllm_protocol(procs, family: str, n_images: int) -> None:
    msgs = messages(n_images, seed=10 + n_images)
    expected = ask(procs, "vllm", family, msgs)
    assert expected[0][0]
    assert ask(procs, "trt", family, msgs) == expected
    assert ask_streamed(procs, "trt", family, msgs) == [expected[0][0]]


@pytest.mark.parametrize("family", ["qwen", "llava"])
def test_red_and_blue_pictures_are_told_apart(procs, family: str) -> None:
    """Same size, so the same tokens: an answer from the other picture's cached prefix
    would say so plainly."""
    for colour in ("red", "blue", "red", "blue"):
        png = draw(colour, "circle", (128, 128)).png()
        url = "data:image/png;base64," + base64.b64encode(png).decode()
        msgs = [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": url}},
                    {"type": "text", "text": "What is in this picture?"},
                ],
            }
        ]
        [(text, finish)] = ask(procs, "trt", family, msgs, max_tokens=20)
        assert (text.strip(), finish) == (f"a {colour} circle", "stop")


@pytest.mark.parametrize("n_images", [0, 1])
def test_n_2_is_one_request_of_two_sequences(procs, n_images: int) -> None:
    msgs = messages(n_images, seed=40, text="Count with me")
    expected = ask(procs, "vllm", "qwen", msgs)[0]
    assert ask(procs, "trt", "qwen", msgs, n=2) == [expected, expected]
    assert ask_streamed(procs, "trt", "qwen", msgs, n=2) == [expected[0]] * 2


def test_a_seed_reaches_the_worker(procs) -> None:
    msgs = messages(0, text="Say anything")
    fields = {"temperature": 1.0, "seed": 7, "max_tokens": 12}
    first = ask(procs, "trt", "qwen", msgs, **fields)
    assert ask(procs, "trt", "qwen", msgs, **fields) == first
    assert ask_streamed(procs, "trt", "qwen", msgs, **fields) == [first[0][0]]


def test_logprobs_equal_the_vllm_protocols(procs) -> None:
    msgs = messages(1, seed=50)
    fields = {"logprobs": True, "top_logprobs": 3}
    ours = create(procs, "trt", "qwen", msgs, **fields).choices[0].logprobs.content
    theirs = create(procs, "vllm", "qwen", msgs, **fields).choices[0].logprobs.content
    assert [t.token for t in ours] == [t.token for t in theirs]
    for mine, other in zip(ours, theirs, strict=True):
        assert mine.logprob == pytest.approx(other.logprob, abs=1e-4)
        assert [t.token for t in mine.top_logprobs] == [t.token for t in other.top_logprobs]


def test_a_json_schema_constrains_the_answer(procs) -> None:
    schema = {
        "type": "object",
        "properties": {"colour": {"type": "string", "enum": ["red", "blue"]}},
        "required": ["colour"],
        "additionalProperties": False,
    }
    fields = {
        "max_tokens": 40,
        "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
    }
    msgs = messages(1, seed=60)
    [(text, finish)] = ask(procs, "trt", "qwen", msgs, **fields)
    assert json.loads(text)["colour"] in ("red", "blue") and finish == "stop"
    assert [(text, finish)] == ask(procs, "vllm", "qwen", msgs, **fields)


def test_stop_strings_and_the_length_cut(procs) -> None:
    msgs = messages(0, text="Count with me")
    [(full, _)] = ask(procs, "vllm", "qwen", msgs, max_tokens=12)
    stop = full.strip().split()[1]
    expected = ask(procs, "vllm", "qwen", msgs, max_tokens=12, stop=[stop])
    assert ask(procs, "trt", "qwen", msgs, max_tokens=12, stop=[stop]) == expected
    assert ask(procs, "trt", "qwen", msgs, max_tokens=2)[0][1] == "length"


def test_a_language_model_only_worker_refuses_images_and_serves_text(procs) -> None:
    text = messages(0)
    assert ask(procs, "trt-lmo", "qwen", text) == ask(procs, "vllm", "qwen", text)
    with pytest.raises(openai.BadRequestError) as refused:
        ask(procs, "trt-lmo", "qwen", messages(1, seed=70))
    assert refused.value.status_code == 400


def test_video_is_refused_by_name(procs) -> None:
    msgs = [
        {
            "role": "user",
            "content": [
                {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}},
                {"type": "text", "text": "What happens?"},
            ],
        }
    ]
    with pytest.raises(openai.BadRequestError) as refused:
        ask(procs, "trt", "qwen", msgs)
    assert refused.value.code == "multimodal_not_supported"
    assert "trtllm" in refused.value.message


def test_pd_over_this_protocol_is_refused_at_start_up(procs) -> None:
    worker = procs["qwen-trt"].address
    args = ["gateway", "--port", "0", "--backend", "trtllm", "--pd-disaggregation"]
    done = subprocess.run(
        [sys.executable, "-m", "tandem.cli", *args, "--prefill", worker, "--decode", worker],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "runtime_pd_not_supported" in done.stderr


async def test_client_disconnect_aborts_the_worker_request(procs) -> None:
    worker = procs["qwen-trt"].address

    async def aborts() -> int:
        return (await stats(worker))["requests_by_outcome"].get("abort", 0)

    before = await aborts()
    body = {
        "model": MODELS["qwen"],
        "messages": messages(1, seed=80),
        "max_tokens": 3000,
        "ignore_eos": True,  # else the trained model's short reply ends before the hang-up
        "temperature": 0,
        "stream": True,
    }
    await hang_up_at_first_data(f"{procs['gw:qwen-trt'].address}/v1/chat/completions", body)
    for _ in range(100):
        if await aborts() > before:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the worker was never told to abort")
