"""PD through the gateway: the correctness matrix, with the openai client.

Every cell compares greedy output with an aggregated worker of the same model. Cells that no
pairing can serve (docs/pd-contract.md §7) must answer their error code before the prefill
worker sees anything.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path

import httpx
import openai
import pytest

from tandem.engine.builtin_shapes import draw

from .gateway_probe import hang_up_at_first_data
from .image_server import png_bytes
from .processes import Proc, start_all
from .wire_helpers import stats

MODELS = {"qwen": "tiny-qwen3-vl", "llava": "tiny-llava-1.5"}
WORKER_ROLES = {
    "agg": ["--role", "both"],
    "prefill": ["--role", "prefill"],
    "decode": ["--role", "decode"],
    "lmo": ["--role", "decode", "--language-model-only"],
}


@pytest.fixture(scope="module")
def pd(model_cache: Path):
    names, specs = [], []
    for family, model in MODELS.items():
        for role, args in WORKER_ROLES.items():
            names.append(f"{family}-{role}")
            specs.append(["worker", "--model", model, *args])
    workers = dict(zip(names, start_all(specs), strict=True))
    gw_names, gw_specs = [], []
    for family in MODELS:
        w = {role: workers[f"{family}-{role}"].address for role in WORKER_ROLES}
        pd_args = ["--pd-disaggregation", "--prefill", w["prefill"]]
        base = ["gateway", "--port", "0", "--mm-processing", "router"]
        gw_names += [f"{family}-agg", f"{family}-pd", f"{family}-pd-lmo"]
        gw_specs += [
            [*base, "--worker-urls", w["agg"]],
            [*base, *pd_args, "--decode", w["decode"]],
            ["gateway", "--port", "0", *pd_args, "--decode", w["lmo"]],  # auto: router (mixed)
        ]
        if family == "qwen":
            gw_names += ["qwen-pd-worker", "qwen-pd-parallel"]
            gw_specs += [
                [
                    "gateway",
                    "--port",
                    "0",
                    "--mm-processing",
                    "worker",
                    *pd_args,
                    "--decode",
                    w["decode"],
                ],
                [*base, *pd_args, "--decode", w["decode"], "--pd-dispatch", "parallel"],
            ]
    gateways = dict(zip(gw_names, start_all(gw_specs), strict=True))
    yield {**workers, **{f"gw:{k}": v for k, v in gateways.items()}}
    for proc in [*gateways.values(), *workers.values()]:
        proc.stop()


def data_url(seed: int) -> str:
    return "data:image/png;base64," + base64.b64encode(png_bytes(seed)).decode()


def messages(n_images: int, seed: int = 0, text: str = "What do you see?") -> list[dict]:
    parts = [
        {"type": "image_url", "image_url": {"url": data_url(seed + i)}} for i in range(n_images)
    ]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


def ask(gateway: Proc, family: str, msgs: list[dict], n: int = 1) -> list[str]:
    client = openai.OpenAI(base_url=f"{gateway.address}/v1", api_key="x", max_retries=0)
    answer = client.chat.completions.create(
        model=MODELS[family], messages=msgs, n=n, max_tokens=6, temperature=0
    )
    return [choice.message.content for choice in answer.choices]


def refused(gateway: Proc, family: str, msgs: list[dict], n: int) -> str:
    with pytest.raises(openai.APIStatusError) as info:
        ask(gateway, family, msgs, n)
    assert info.value.status_code == 400
    return info.value.response.json()["error"]["code"]


def prefill_requests(proc: Proc) -> int:
    return proc.count("Generate request")


@pytest.mark.parametrize("family", ["qwen", "llava"])
@pytest.mark.parametrize("n_images", [0, 1, 2])
@pytest.mark.parametrize("n", [1, 2])
def test_matrix(pd, family: str, n_images: int, n: int) -> None:
    msgs = messages(n_images, seed=40 + n_images)
    expected = ask(pd[f"gw:{family}-agg"], family, msgs, n)
    assert ask(pd[f"gw:{family}-pd"], family, msgs, n) == expected
    if family == "qwen":
        assert ask(pd["gw:qwen-pd-worker"], family, msgs, n) == expected
    lmo_gateway, prefill = pd[f"gw:{family}-pd-lmo"], pd[f"{family}-prefill"]
    if n_images and family == "qwen":
        before = prefill_requests(prefill)
        assert refused(lmo_gateway, family, msgs, n) == "pd_decode_language_model_only_mrope"
        assert prefill_requests(prefill) == before, "the prefill worker must see nothing"
    elif n_images and n > 1:
        before = prefill_requests(prefill)
        assert refused(lmo_gateway, family, msgs, n) == "pd_decode_language_model_only_n_samples"
        assert prefill_requests(prefill) == before
    else:
        assert ask(lmo_gateway, family, msgs, n) == expected


def test_same_text_different_images_through_pd(pd) -> None:
    for family, gateway in (("llava", "gw:llava-pd-lmo"), ("qwen", "gw:qwen-pd")):
        answers = []
        for seed in (70, 71, 70):
            msgs = messages(1, seed=seed, text="Is this a dog?")
            expected = ask(pd[f"gw:{family}-agg"], family, msgs)
            assert ask(pd[gateway], family, msgs) == expected
            answers.append(expected)
        assert answers[0] != answers[1] and answers[0] == answers[2]


def _picture_messages(colour: str) -> list[dict]:
    png = draw(colour, "circle", (128, 128)).png()
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    parts = [{"type": "image_url", "image_url": {"url": url}}]
    question = {"type": "text", "text": "What is in this picture?"}
    return [{"role": "user", "content": [*parts, question]}]


@pytest.mark.parametrize(
    ("family", "gateway"),
    [
        ("qwen", "gw:qwen-pd"),  # router path
        ("qwen", "gw:qwen-pd-worker"),  # the prefill worker processes the image
        ("qwen", "gw:qwen-pd-parallel"),
        ("llava", "gw:llava-pd"),
        ("llava", "gw:llava-pd-lmo"),  # the decode worker has no vision tower
    ],
)
def test_red_and_blue_pictures_are_told_apart_through_pd(pd, family: str, gateway: str) -> None:
    """Readable isolation probe: the same prompt with a red, a blue, then the red picture
    again (same size, so same token count) must be answered "red", "blue", "red": a decode
    leg that answered from the other picture's KV (or prefix cache) would say it plainly."""
    for colour in ("red", "blue", "red"):
        for name in (gateway, f"gw:{family}-agg"):
            client = openai.OpenAI(base_url=f"{pd[name].address}/v1", api_key="x", max_retries=0)
            reply = client.chat.completions.create(
                model=MODELS[family],
                messages=_picture_messages(colour),
                max_tokens=20,
                temperature=0,
            )
            got = (reply.choices[0].message.content.strip(), reply.choices[0].finish_reason)
            assert got == (f"a {colour} circle", "stop"), name


def metric(gateway: Proc, name: str, **labels: str) -> float:
    text = httpx.get(f"{gateway.address}/metrics").text
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    match = re.search(rf"^{name}{{{want}}} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def test_decode_leg_carries_no_pixels(pd) -> None:
    """Per-leg tensor bytes of one n=1 image request (n > 1 uses the Full form on purpose)."""
    gateway, name = pd["gw:qwen-pd"], "tandem_mm_tensor_bytes_total"
    legs = [("prefill", "pixel"), ("decode", "pixel"), ("decode", "other")]
    before = [metric(gateway, name, leg=leg, kind=kind) for leg, kind in legs]
    ask(gateway, "qwen", messages(2, seed=80))
    after = [metric(gateway, name, leg=leg, kind=kind) for leg, kind in legs]
    prefill_pixels, decode_pixels, decode_other = (
        b - a for a, b in zip(before, after, strict=True)
    )
    assert prefill_pixels > 0
    assert decode_pixels == 0
    assert 0 < decode_other < 1024  # the M-RoPE grids only


async def test_worker_path_processes_media_once(pd) -> None:
    prefill, decode = pd["qwen-prefill"].address, pd["qwen-decode"].address
    before = [(await stats(a))["media_items_processed"] for a in (prefill, decode)]
    ask(pd["gw:qwen-pd-worker"], "qwen", messages(2, seed=90))
    after = [(await stats(a))["media_items_processed"] for a in (prefill, decode)]
    assert [b - a for a, b in zip(before, after, strict=True)] == [2, 0]
    assert (await stats(prefill))["held_kv_blocks"] == 0


@pytest.mark.parametrize("n_images,n", [(0, 1), (0, 2), (1, 1)])
def test_parallel_dispatch_matches_sequential(pd, n_images: int, n: int) -> None:
    msgs = messages(n_images, seed=95)
    assert ask(pd["gw:qwen-pd-parallel"], "qwen", msgs, n) == ask(pd["gw:qwen-pd"], "qwen", msgs, n)


@pytest.mark.parametrize("gateway", ["gw:qwen-pd", "gw:qwen-pd-parallel"])
async def test_client_disconnect_aborts_the_decode_leg(pd, gateway: str) -> None:
    import asyncio

    decode = pd["qwen-decode"].address

    async def aborts() -> int:
        return (await stats(decode))["requests_by_outcome"].get("abort", 0)

    before = await aborts()
    body = {
        "model": MODELS["qwen"],
        "messages": messages(1, seed=99),
        "max_tokens": 3000,
        "ignore_eos": True,  # else the trained model's short reply ends before the hang-up
        "temperature": 0,
        "stream": True,
    }
    url = f"{pd[gateway].address}/v1/chat/completions"
    await hang_up_at_first_data(url, body)
    for _ in range(100):
        if await aborts() > before:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the decode worker was never told to abort")
    assert (await stats(pd["qwen-prefill"].address))["held_kv_blocks"] == 0
