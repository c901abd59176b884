"""Tandem's gateway in front of Tandem's MLX-protocol workers, with the openai client.

Real `tandem worker --protocol mlx` processes (real forward passes of both built-in models)
behind gateways that find the protocol themselves (`--backend auto`), each answer compared
with the same gateway in front of the same model served over the vLLM protocol: greedy text,
finish reasons and token counts, streamed and not, logprobs with their alternatives, n = 2
(two MLX requests, one per sample) greedy and seeded, stop strings (applied by the gateway),
a max_tokens cut, legacy completions. Then what MLX cannot carry, refused by name: images,
response_format, PD at start-up; and a client that leaves aborts the worker's request.
"""

from __future__ import annotations

import asyncio
import base64
import subprocess
import sys
from pathlib import Path
from typing import Any

import openai
import pytest

from .gateway_probe import hang_up_at_first_data
from .image_server import png_bytes
from .processes import Proc, start_all
from .wire_helpers import stats

pytestmark = pytest.mark.slow
MODELS = {"qwen": "tiny-qwen3-vl", "llava": "tiny-llava-1.5"}
PROMPTS = ["Count with me", "What is in this picture?"]
# Logprob values may differ in the last bits (a prefix-cache hit computes the prompt's tail
# alone); the tokens and alternatives must be the same.
LOGPROB_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def procs(model_cache: Path) -> Any:
    names, specs = [], []
    for family, model in MODELS.items():
        for name, args in (("mlx", ["--protocol", "mlx"]), ("vllm", [])):
            names.append(f"{family}-{name}")
            specs.append(["worker", "--model", model, *args])
    workers = dict(zip(names, start_all(specs), strict=True))
    gateways = dict(
        zip(
            names,
            start_all(
                [["gateway", "--port", "0", "--worker-urls", workers[n].address] for n in names]
            ),
            strict=True,
        )
    )
    yield {**workers, **{f"gw:{k}": v for k, v in gateways.items()}}
    for proc in [*gateways.values(), *workers.values()]:
        proc.stop()


def client(gateway: Proc) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.address}/v1", api_key="x", max_retries=0)


def chat(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def _logprobs(content: Any) -> list[tuple[str, float, list[tuple[str, float]]]] | None:
    if content is None:
        return None
    return [(t.token, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs]) for t in content]


def ask(procs: Any, name: str, family: str, **fields: Any) -> dict[str, Any]:
    """A chat answer, in the parts both protocols must agree on (cached tokens may not: the
    MLX samples are requests of their own, the second finds the first's prompt cached)."""
    fields = {"max_tokens": 8, "temperature": 0, "messages": chat(PROMPTS[0]), **fields}
    answer = client(procs[f"gw:{family}-{name}"]).chat.completions.create(
        model=MODELS[family], **fields
    )
    assert answer.usage is not None
    return {
        "choices": [
            (
                c.index,
                c.message.content,
                c.finish_reason,
                _logprobs(c.logprobs.content if c.logprobs else None),
            )
            for c in answer.choices
        ],
        "usage": (answer.usage.prompt_tokens, answer.usage.completion_tokens),
    }


def ask_streamed(procs: Any, name: str, family: str, **fields: Any) -> dict[str, Any]:
    fields = {"max_tokens": 8, "temperature": 0, "messages": chat(PROMPTS[0]), **fields}
    n = fields.get("n", 1)
    texts, reasons = [""] * n, [""] * n
    tokens: list[list[Any]] = [[] for _ in range(n)]
    usage = None
    stream = client(procs[f"gw:{family}-{name}"]).chat.completions.create(
        model=MODELS[family], stream=True, stream_options={"include_usage": True}, **fields
    )
    for chunk in stream:
        if chunk.usage is not None:
            usage = (chunk.usage.prompt_tokens, chunk.usage.completion_tokens)
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            reasons[c.index] = c.finish_reason or reasons[c.index]
            if c.logprobs is not None and c.logprobs.content:
                tokens[c.index] += _logprobs(c.logprobs.content) or []
    return {"texts": texts, "reasons": reasons, "logprobs": tokens, "usage": usage}


def _split(value: Any, numbers: list[float]) -> Any:
    """``value`` with its floats taken out into ``numbers`` (in order)."""
    if isinstance(value, float):
        numbers.append(value)
        return float
    if isinstance(value, dict):
        return {k: _split(v, numbers) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_split(v, numbers) for v in value]
    return value


def assert_same(got: Any, expected: Any) -> None:
    """Equal, logprob values within the tolerance."""
    got_numbers: list[float] = []
    expected_numbers: list[float] = []
    assert _split(got, got_numbers) == _split(expected, expected_numbers)
    assert got_numbers == pytest.approx(expected_numbers, abs=LOGPROB_TOLERANCE)


CASES: list[dict[str, Any]] = [
    {"messages": chat(PROMPTS[0])},
    {"messages": chat(PROMPTS[1]), "max_tokens": 24},
    {"logprobs": True, "top_logprobs": 2},
    {"logprobs": True},
    {"n": 2, "seed": 5},
    {"n": 2, "seed": 5, "temperature": 2.0, "max_tokens": 12},  # samples that differ
    {"max_tokens": 3},
    {"stop": [" a"], "max_tokens": 16},
]


def _case_id(case: dict[str, Any]) -> str:
    return ",".join(k for k in case if k != "messages") or "plain"


@pytest.mark.parametrize("family", list(MODELS))
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_mlx_answers_equal_the_vllm_protocol(procs, family: str, case: dict[str, Any]) -> None:
    expected = ask(procs, "vllm", family, **case)
    assert expected["choices"][0][1], "the model answered something"
    assert_same(ask(procs, "mlx", family, **case), expected)
    assert_same(
        ask_streamed(procs, "mlx", family, **case), ask_streamed(procs, "vllm", family, **case)
    )


def test_the_cases_cut_and_stop(procs) -> None:
    """The comparisons above cover both ends: a length cut and a stop string that matched."""
    cut = ask(procs, "mlx", "qwen", max_tokens=3)
    assert cut["choices"][0][2] == "length" and cut["usage"][1] == 3
    whole = ask(procs, "mlx", "qwen", max_tokens=16)["choices"][0][1]
    stopped = ask(procs, "mlx", "qwen", stop=[" a"], max_tokens=16)["choices"][0]
    assert " a" in whole and stopped[1] == whole[: whole.index(" a")] and stopped[2] == "stop"


def test_each_sample_has_its_own_seed(procs) -> None:
    """Sample i of seed s is drawn with seed s + i, as an engine's own n > 1 draws it."""
    hot = {"temperature": 2.0, "max_tokens": 12}
    pair = [c[1] for c in ask(procs, "mlx", "qwen", n=2, seed=5, **hot)["choices"]]
    assert pair[0] != pair[1]
    assert ask(procs, "mlx", "qwen", seed=6, **hot)["choices"][0][1] == pair[1]


@pytest.mark.parametrize("family", list(MODELS))
def test_legacy_completions_equal_the_vllm_protocol(procs, family: str) -> None:
    def complete(name: str) -> Any:
        answer = client(procs[f"gw:{family}-{name}"]).completions.create(
            model=MODELS[family], prompt="Once upon", max_tokens=6, temperature=0, logprobs=1
        )
        c = answer.choices[0]
        assert c.logprobs is not None and answer.usage is not None
        return (
            c.text,
            c.finish_reason,
            c.logprobs.tokens,
            c.logprobs.top_logprobs,
            answer.usage.completion_tokens,
        )

    assert_same(complete("mlx"), complete("vllm"))


def test_the_gateways_detected_mlx(procs) -> None:
    for family in MODELS:
        assert procs[f"gw:{family}-mlx"].count("worker protocol: mlx (--backend auto") == 1
        assert procs[f"gw:{family}-vllm"].count("worker protocol: vllm (--backend auto") == 1


def test_an_image_is_refused_by_name(procs) -> None:
    url = "data:image/png;base64," + base64.b64encode(png_bytes(3)).decode()
    parts = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "?"}]
    with pytest.raises(openai.BadRequestError) as info:
        client(procs["gw:qwen-mlx"]).chat.completions.create(
            model=MODELS["qwen"], messages=[{"role": "user", "content": parts}], max_tokens=4
        )
    assert info.value.code == "multimodal_not_supported"
    assert "mlx worker protocol" in str(info.value.message)


def test_response_format_is_refused_by_name(procs) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client(procs["gw:llava-mlx"]).chat.completions.create(
            model=MODELS["llava"],
            messages=chat("Give me JSON"),
            max_tokens=4,
            response_format={"type": "json_object"},
        )
    assert info.value.code == "unsupported_parameter"
    assert info.value.param == "response_format"


def test_pd_with_the_mlx_protocol_is_refused_at_start(procs) -> None:
    mlx = procs["qwen-mlx"].address
    for backend in ("mlx", "auto"):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "tandem.cli",
                "gateway",
                "--port",
                "0",
                "--backend",
                backend,
                "--pd-disaggregation",
                "--prefill",
                mlx,
                "--decode",
                mlx,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode != 0, backend
        assert "the mlx worker protocol has no PD pairing" in done.stderr, done.stderr[-2000:]


async def test_a_client_that_leaves_aborts_the_workers_request(procs) -> None:
    worker = procs["qwen-mlx"].address

    async def aborts() -> int:
        return (await stats(worker))["requests_by_outcome"].get("abort", 0)

    before = await aborts()
    body = {
        "model": MODELS["qwen"],
        "messages": chat(PROMPTS[0]),
        "max_tokens": 3000,
        "ignore_eos": True,  # else the trained model's short reply ends before the hang-up
        "temperature": 0,
        "stream": True,
    }
    await hang_up_at_first_data(f"{procs['gw:qwen-mlx'].address}/v1/chat/completions", body)
    for _ in range(100):
        if await aborts() > before:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the mlx worker was never told to abort")
