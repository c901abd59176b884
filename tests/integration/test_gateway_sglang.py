"""Tandem's gateway in front of Tandem's SGLang-protocol workers, with the openai client.

Real `tandem worker --protocol sglang` processes (real forward passes, KV pulled over the
side channel at the bootstrap room) behind gateways that find the protocol themselves
(`--backend auto`). Every answer is greedy and compared: PD with aggregated SGLang, and
both with an aggregated vLLM-protocol worker of the same model, for text, one image and
two images; structured outputs, tools and logprobs included.
"""

from __future__ import annotations

import asyncio
import base64
import json
import signal
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
    "sglang-both": ["--protocol", "sglang", "--role", "both"],
    "sglang-prefill": ["--protocol", "sglang", "--role", "prefill"],
    "sglang-decode": ["--protocol", "sglang", "--role", "decode"],
    "vllm-both": ["--role", "both"],
}


@pytest.fixture(scope="module")
def procs(model_cache: Path):
    names, specs = [], []
    for family, model in MODELS.items():
        for name, args in WORKERS.items():
            names.append(f"{family}-{name}")
            specs.append(["worker", "--model", model, *args])
    names.append("qwen-sglang-prefill-doomed")
    specs.append(["worker", "--model", MODELS["qwen"], *WORKERS["sglang-prefill"]])
    workers = dict(zip(names, start_all(specs), strict=True))
    gw_names, gw_specs = [], []
    for family in MODELS:
        w = {name: workers[f"{family}-{name}"].address for name in WORKERS}
        base = ["gateway", "--port", "0"]
        gw_names += [f"{family}-sglang-agg", f"{family}-sglang-pd", f"{family}-vllm-agg"]
        gw_specs += [
            [*base, "--worker-urls", w["sglang-both"]],
            [
                *base,
                "--pd-disaggregation",
                "--prefill",
                w["sglang-prefill"],
                "--decode",
                w["sglang-decode"],
            ],
            [*base, "--worker-urls", w["vllm-both"]],
        ]
    # Every second pair's prefill leg meets a dead worker (its health checks too slow to
    # notice): the leg fails to start, the decode leg is dropped, the pair is retried.
    qwen = {name: workers[f"qwen-{name}"].address for name in WORKERS}
    gw_names.append("qwen-sglang-retry")
    gw_specs.append(
        [
            "gateway",
            "--port",
            "0",
            "--pd-disaggregation",
            "--prefill",
            workers["qwen-sglang-prefill-doomed"].address,
            qwen["sglang-prefill"],
            "--decode",
            qwen["sglang-decode"],
            "--prefill-policy",
            "round_robin",
            "--health-check-interval-secs",
            "600",
        ]
    )
    gateways = dict(zip(gw_names, start_all(gw_specs), strict=True))
    workers["qwen-sglang-prefill-doomed"].stop(signal.SIGKILL)
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


def ask(gateway: Proc, family: str, msgs: list[dict], **fields: Any) -> list[tuple[str, str]]:
    fields = {"max_tokens": 8, "temperature": 0, **fields}
    answer = client(gateway).chat.completions.create(model=MODELS[family], messages=msgs, **fields)
    return [(c.message.content or "", c.finish_reason) for c in answer.choices]


def ask_streamed(gateway: Proc, family: str, msgs: list[dict], n: int = 1) -> list[str]:
    texts = [""] * n
    stream = client(gateway).chat.completions.create(
        model=MODELS[family], messages=msgs, max_tokens=8, temperature=0, n=n, stream=True
    )
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    return texts


@pytest.mark.parametrize("family", ["qwen", "llava"])
@pytest.mark.parametrize("n_images", [0, 1, 2])
def test_pd_equals_aggregated_equals_the_vllm_protocol(procs, family: str, n_images: int) -> None:
    msgs = messages(n_images, seed=10 + n_images)
    expected = ask(procs[f"gw:{family}-vllm-agg"], family, msgs)
    assert expected[0][0]
    assert ask(procs[f"gw:{family}-sglang-agg"], family, msgs) == expected
    assert ask(procs[f"gw:{family}-sglang-pd"], family, msgs) == expected
    streamed = ask_streamed(procs[f"gw:{family}-sglang-pd"], family, msgs)
    assert streamed == [expected[0][0]]


@pytest.mark.parametrize("family", ["qwen", "llava"])
def test_red_and_blue_pictures_are_told_apart_through_sglang_pd(procs, family: str) -> None:
    """The same prompt with a red, a blue, then the red picture again (same size, so the
    same tokens): a decode leg answering from the other picture's KV would say so plainly."""
    for colour in ("red", "blue", "red"):
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
        [(text, finish)] = ask(procs[f"gw:{family}-sglang-pd"], family, msgs, max_tokens=20)
        assert (text.strip(), finish) == (f"a {colour} circle", "stop")


async def test_the_decode_leg_carries_no_pixels_and_the_room_is_freed(procs) -> None:
    prefill, decode = procs["qwen-sglang-prefill"].address, procs["qwen-sglang-decode"].address
    before = [(await stats(a))["leg_bytes"] for a in (prefill, decode)]
    ask(procs["gw:qwen-sglang-pd"], "qwen", messages(2, seed=30))
    after = [(await stats(a))["leg_bytes"] for a in (prefill, decode)]

    def grew(legs_before: dict, legs_after: dict, leg: str, key: str) -> int:
        return legs_after[leg][key] - legs_before.get(leg, {}).get(key, 0)

    assert grew(before[0], after[0], "prefill", "pixel_bytes") > 0
    assert grew(before[1], after[1], "decode", "requests") == 1
    assert grew(before[1], after[1], "decode", "pixel_bytes") == 0
    assert (await stats(prefill))["held_kv_blocks"] == 0


def test_n_2_streamed_through_pd(procs) -> None:
    msgs = messages(0, text="Count with me")
    expected = ask(procs["gw:qwen-vllm-agg"], "qwen", msgs)[0][0]
    # Greedy: both samples of each pair follow the one best path.
    assert ask_streamed(procs["gw:qwen-sglang-pd"], "qwen", msgs, n=2) == [expected, expected]
    with_image = messages(1, seed=40)
    expected = ask(procs["gw:qwen-vllm-agg"], "qwen", with_image)[0][0]
    assert ask_streamed(procs["gw:qwen-sglang-pd"], "qwen", with_image, n=2) == [expected] * 2


@pytest.mark.parametrize(
    "fields",
    [
        {"response_format": {"type": "json_object"}, "max_tokens": 24},
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": "colour",
                    "schema": {
                        "type": "object",
                        "properties": {"colour": {"type": "string", "enum": ["red", "blue"]}},
                        "required": ["colour"],
                    },
                },
            },
            "max_tokens": 24,
        },
        {"extra_body": {"structured_outputs": {"choice": ["yes", "no"]}}},
        {"extra_body": {"structured_outputs": {"regex": "[a-c]{3}"}}},
    ],
)
def test_structured_outputs_equal_the_vllm_protocols(procs, fields: dict) -> None:
    msgs = messages(1, seed=50, text="Answer in JSON")

    def full(gateway: str) -> Any:
        answer = client(procs[gateway]).chat.completions.create(
            model=MODELS["qwen"], messages=msgs, temperature=0, **{"max_tokens": 8, **fields}
        )
        choice = answer.choices[0]
        return choice.message.content, choice.finish_reason

    expected = full("gw:qwen-vllm-agg")
    assert full("gw:qwen-sglang-pd") == expected
    if "response_format" in fields and expected[1] == "stop":
        json.loads(expected[0])  # a reply cut by max_tokens is a JSON prefix only


def test_logprobs_equal_the_vllm_protocols(procs) -> None:
    """Same tokens and alternatives; values within float32 noise (KV computed elsewhere)."""

    def entries(gateway: str) -> list[tuple[str, float, list[tuple[str, float]]]]:
        answer = client(procs[gateway]).chat.completions.create(
            model=MODELS["qwen"],
            messages=messages(1, seed=55),
            temperature=0,
            max_tokens=5,
            logprobs=True,
            top_logprobs=2,
        )
        content = answer.choices[0].logprobs.content
        return [
            (e.token, e.logprob, [(t.token, t.logprob) for t in e.top_logprobs]) for e in content
        ]

    expected, got = entries("gw:qwen-vllm-agg"), entries("gw:qwen-sglang-pd")
    assert len(expected) == 5 and [e[0] for e in got] == [e[0] for e in expected]
    for (_, value, tops), (_, want, want_tops) in zip(got, expected, strict=True):
        assert value == pytest.approx(want, abs=1e-4)
        assert [t for t, _ in tops] == [t for t, _ in want_tops]
        assert [v for _, v in tops] == pytest.approx([v for _, v in want_tops], abs=1e-4)


def test_forced_tool_calls_equal_the_vllm_protocols(procs) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "paint",
                "parameters": {
                    "type": "object",
                    "properties": {"colour": {"type": "string"}},
                    "required": ["colour"],
                },
            },
        }
    ]

    def call(gateway: str) -> Any:
        answer = client(procs[gateway]).chat.completions.create(
            model=MODELS["qwen"],
            messages=messages(1, seed=60, text="Paint it"),
            tools=tools,
            tool_choice={"type": "function", "function": {"name": "paint"}},
            temperature=0,
            max_tokens=30,
        )
        calls = answer.choices[0].message.tool_calls or []
        return [(c.function.name, json.loads(c.function.arguments)) for c in calls]

    expected = call("gw:qwen-vllm-agg")
    assert expected and expected[0][0] == "paint"
    assert call("gw:qwen-sglang-pd") == expected


def test_seed_is_refused_by_name_before_any_leg(procs) -> None:
    prefill = procs["qwen-sglang-prefill"]
    before = prefill.count("Generate request")
    with pytest.raises(openai.BadRequestError) as info:
        ask(procs["gw:qwen-sglang-pd"], "qwen", messages(0), seed=1)
    error = info.value.response.json()["error"]
    assert error["code"] == "unsupported_parameter" and error["param"] == "seed"
    assert prefill.count("Generate request") == before


async def test_client_disconnect_aborts_both_legs_and_frees_the_kv(procs) -> None:
    prefill, decode = procs["qwen-sglang-prefill"].address, procs["qwen-sglang-decode"].address

    async def aborts() -> int:
        return (await stats(decode))["requests_by_outcome"].get("abort", 0)

    before = await aborts()
    body = {
        "model": MODELS["qwen"],
        "messages": messages(1, seed=70),
        "max_tokens": 3000,
        "ignore_eos": True,  # else the trained model's short reply ends before the hang-up
        "temperature": 0,
        "stream": True,
    }
    url = f"{procs['gw:qwen-sglang-pd'].address}/v1/chat/completions"
    await hang_up_at_first_data(url, body)
    for _ in range(100):
        if await aborts() > before:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the decode worker was never told to abort")
    assert (await stats(prefill))["held_kv_blocks"] == 0


async def test_a_prefill_leg_that_fails_to_start_is_retried_and_its_partner_dropped(procs) -> None:
    msgs = messages(0, text="Say something")
    expected = ask(procs["gw:qwen-vllm-agg"], "qwen", msgs)
    for _ in range(4):  # round robin: two of these meet the dead prefill worker first
        assert ask(procs["gw:qwen-sglang-retry"], "qwen", msgs) == expected
    retries = procs["gw:qwen-sglang-retry"].count("retrying on another pair")
    assert retries >= 2
    decode = procs["qwen-sglang-decode"].address

    for _ in range(100):  # the dropped decode legs end on their worker too
        if (await stats(decode))["running"] == 0:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("decode legs of failed pairs still run on the decode worker")
    assert (await stats(procs["qwen-sglang-prefill"].address))["held_kv_blocks"] == 0
