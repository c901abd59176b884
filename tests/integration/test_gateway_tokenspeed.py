"""Tandem's gateway in front of Tandem's TokenSpeed-protocol workers: aggregated, PD and
E/P/D, with the openai client.

Real `tandem worker --protocol tokenspeed` processes (real forward passes; KV pulled over
the side channel at the KV bootstrap room; image features pulled from a real encode worker,
`--role encode`, at each item's room) behind gateways that find the protocol themselves
(`--backend auto`). Every answer is greedy and compared with an aggregated vLLM-protocol
worker of the same model, for text, one image and two images. Under E/P/D the prefill
worker that runs the language model only (no vision tower at all) serves image requests.
"""

from __future__ import annotations

import asyncio
import base64
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
TS = ["--protocol", "tokenspeed"]
WORKERS = {
    "ts-both": [*TS, "--role", "both"],
    "ts-prefill": [*TS, "--role", "prefill"],
    "ts-decode": [*TS, "--role", "decode"],
    "ts-encode": [*TS, "--role", "encode", "--embedding-cache-mb", "64"],
    "ts-prefill-lmo": [*TS, "--role", "prefill", "--language-model-only"],
    "vllm-both": ["--role", "both"],
}


@pytest.fixture(scope="module")
def procs(model_cache: Path):
    names, specs = [], []
    for family, model in MODELS.items():
        for name, args in WORKERS.items():
            names.append(f"{family}-{name}")
            specs.append(["worker", "--model", model, *args])
    workers = dict(zip(names, start_all(specs), strict=True))
    gw_names, gw_specs = [], []
    for family in MODELS:
        w = {name: workers[f"{family}-{name}"].address for name in WORKERS}
        base = ["gateway", "--port", "0"]
        pd = ["--prefill", w["ts-prefill"], "--decode", w["ts-decode"]]
        gw_names += [f"{family}-{n}" for n in ("ts-agg", "ts-pd", "ts-epd", "ts-epd-lmo", "vllm")]
        gw_specs += [
            [*base, "--worker-urls", w["ts-both"]],
            [*base, "--pd-disaggregation", *pd],
            [*base, "--epd-disaggregation", "--encode", w["ts-encode"], *pd],
            [
                *base,
                "--epd-disaggregation",
                "--encode",
                w["ts-encode"],
                "--prefill",
                w["ts-prefill-lmo"],
                "--decode",
                w["ts-decode"],
            ],
            [*base, "--worker-urls", w["vllm-both"]],
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
def test_pd_and_epd_equal_aggregated_and_the_vllm_protocol(
    procs, family: str, n_images: int
) -> None:
    msgs = messages(n_images, seed=10 + n_images)
    expected = ask(procs[f"gw:{family}-vllm"], family, msgs)
    assert expected[0][0]
    for mode in ("ts-agg", "ts-pd", "ts-epd", "ts-epd-lmo"):
        assert ask(procs[f"gw:{family}-{mode}"], family, msgs) == expected, mode
    for mode in ("ts-pd", "ts-epd"):
        assert ask_streamed(procs[f"gw:{family}-{mode}"], family, msgs) == [expected[0][0]]


@pytest.mark.parametrize("family", ["qwen", "llava"])
@pytest.mark.parametrize("mode", ["ts-pd", "ts-epd"])
def test_red_and_blue_pictures_are_told_apart(procs, family: str, mode: str) -> None:
    """The same prompt with a red, a blue, then the red picture again (same size, so the
    same tokens): an answer from the other picture's KV, or from the other picture's cached
    embedding, would say so plainly."""
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
        [(text, finish)] = ask(procs[f"gw:{family}-{mode}"], family, msgs, max_tokens=20)
        assert (text.strip(), finish) == (f"a {colour} circle", "stop")


def grew(before: dict, after: dict, leg: str, key: str) -> int:
    return after.get(leg, {}).get(key, 0) - before.get(leg, {}).get(key, 0)


async def test_the_decode_leg_carries_no_pixels_and_the_room_is_freed(procs) -> None:
    prefill, decode = procs["qwen-ts-prefill"].address, procs["qwen-ts-decode"].address
    before = [(await stats(a))["leg_bytes"] for a in (prefill, decode)]
    ask(procs["gw:qwen-ts-pd"], "qwen", messages(2, seed=30))
    after = [(await stats(a))["leg_bytes"] for a in (prefill, decode)]
    assert grew(before[0], after[0], "prefill", "pixel_bytes") > 0
    assert grew(before[1], after[1], "decode", "requests") == 1
    assert grew(before[1], after[1], "decode", "pixel_bytes") == 0
    assert (await stats(prefill))["held_kv_blocks"] == 0


@pytest.mark.parametrize("prefill_name", ["ts-prefill", "ts-prefill-lmo"])
async def test_under_epd_the_prefill_gets_no_pixels_and_runs_no_vision_tower(
    procs, prefill_name: str
) -> None:
    gateway = procs["gw:qwen-ts-epd" if prefill_name == "ts-prefill" else "gw:qwen-ts-epd-lmo"]
    names = (prefill_name, "ts-decode", "ts-encode")
    addresses = [procs[f"qwen-{name}"].address for name in names]
    before = [await stats(a) for a in addresses]
    ask(gateway, "qwen", messages(2, seed=80 if prefill_name == "ts-prefill" else 90))
    after = [await stats(a) for a in addresses]
    (p0, d0, e0), (p1, d1, e1) = before, after
    assert grew(p0["leg_bytes"], p1["leg_bytes"], "prefill", "requests") == 1
    assert grew(p0["leg_bytes"], p1["leg_bytes"], "prefill", "pixel_bytes") == 0
    assert grew(d0["leg_bytes"], d1["leg_bytes"], "decode", "pixel_bytes") == 0
    assert p1["vision_encodes"] == p0["vision_encodes"]  # the prefill ran no vision tower
    assert d1["vision_encodes"] == d0["vision_encodes"]
    assert e1["encode_requests"]["accepted"] - e0["encode_requests"]["accepted"] == 2
    assert e1["encoder"]["vision_encodes"] - e0["encoder"]["vision_encodes"] == 2
    assert e1["embedding_store"]["held"] == 0  # both embeddings were pulled
    assert p1["held_kv_blocks"] == 0


async def test_a_repeated_image_is_encoded_once(procs) -> None:
    encode = procs["qwen-ts-encode"].address
    msgs = messages(1, seed=100)
    first = ask(procs["gw:qwen-ts-epd"], "qwen", msgs)
    before = (await stats(encode))["embedding_cache"]
    assert ask(procs["gw:qwen-ts-epd"], "qwen", msgs) == first
    assert ask(procs["gw:qwen-ts-epd-lmo"], "qwen", msgs) == first
    after = (await stats(encode))["embedding_cache"]
    assert after["hits"] - before["hits"] == 2 and after["misses"] == before["misses"]


def test_n_2_through_pd_and_epd(procs) -> None:
    text = messages(0, text="Count with me")
    expected = ask(procs["gw:qwen-vllm"], "qwen", text)[0][0]
    assert ask_streamed(procs["gw:qwen-ts-pd"], "qwen", text, n=2) == [expected, expected]
    with_image = messages(1, seed=40)
    expected = ask(procs["gw:qwen-vllm"], "qwen", with_image)[0][0]
    for mode in ("ts-pd", "ts-epd"):
        assert ask_streamed(procs[f"gw:qwen-{mode}"], "qwen", with_image, n=2) == [expected] * 2


def test_a_seed_reaches_the_workers(procs) -> None:
    msgs = messages(0, text="Say anything")
    fields = {"temperature": 1.0, "seed": 7, "max_tokens": 12}
    first = ask(procs["gw:qwen-ts-pd"], "qwen", msgs, **fields)
    assert ask(procs["gw:qwen-ts-pd"], "qwen", msgs, **fields) == first
    assert ask(procs["gw:qwen-ts-agg"], "qwen", msgs, **fields) == first


async def test_client_disconnect_aborts_both_legs_and_frees_the_kv(procs) -> None:
    prefill, decode = procs["qwen-ts-prefill"].address, procs["qwen-ts-decode"].address

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
    await hang_up_at_first_data(f"{procs['gw:qwen-ts-epd'].address}/v1/chat/completions", body)
    for _ in range(100):
        if await aborts() > before:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the decode worker was never told to abort")
    assert (await stats(prefill))["held_kv_blocks"] == 0
