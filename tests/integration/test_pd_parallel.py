"""Parallel PD dispatch answers exactly what an aggregated worker answers.

Both legs go out at once (the decode worker waits for KV under a gateway-minted
transfer id). The prefill leg is its own message: the request the answer is built from,
and the one a retry sends again, stays what the client asked for. Checked with the
openai client for both built-in models, streamed and not, with stop strings, n = 2
(fanned out into two pairs), on the router and the worker media paths, and for a retry
after a prefill leg that fails to start.
"""

from __future__ import annotations

import base64
import signal
from pathlib import Path

import openai
import pytest

from .image_server import png_bytes
from .processes import Proc, start_all

MODELS = {"qwen": "tiny-qwen3-vl", "llava": "tiny-llava-1.5"}
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def procs(model_cache: Path):
    """Per model: an aggregated worker, a PD pair, and gateways over them.

    Qwen also gets a second prefill worker that is killed after start-up, behind a
    round-robin parallel gateway whose health checks are too slow to notice: every
    second request's prefill leg fails to start there and must be retried elsewhere.
    """
    names, specs = [], []
    for family, model in MODELS.items():
        for role in ("both", "prefill", "decode"):
            names.append(f"{family}-{role}")
            specs.append(["worker", "--model", model, "--role", role])
    names.append("qwen-prefill-doomed")
    specs.append(["worker", "--model", MODELS["qwen"], "--role", "prefill"])
    workers = dict(zip(names, start_all(specs), strict=True))
    gw_names, gw_specs = [], []
    for family in MODELS:
        agg, prefill, decode = (
            workers[f"{family}-{r}"].address for r in ("both", "prefill", "decode")
        )
        pd = ["--pd-disaggregation", "--prefill", prefill, "--decode", decode]
        parallel = [*pd, "--pd-dispatch", "parallel"]
        gw_names += [f"{family}-agg", f"{family}-parallel"]
        gw_specs += [
            ["gateway", "--port", "0", "--mm-processing", "router", "--worker-urls", agg],
            ["gateway", "--port", "0", "--mm-processing", "router", *parallel],
        ]
        if family == "qwen":
            doomed = workers["qwen-prefill-doomed"].address
            gw_names += ["qwen-parallel-worker-path", "qwen-parallel-retry", "qwen-sequential"]
            gw_specs += [
                ["gateway", "--port", "0", "--mm-processing", "worker", *parallel],
                [
                    "gateway",
                    "--port",
                    "0",
                    "--pd-disaggregation",
                    "--prefill",
                    doomed,
                    prefill,
                    "--decode",
                    decode,
                    "--pd-dispatch",
                    "parallel",
                    "--prefill-policy",
                    "round_robin",
                    "--health-check-interval-secs",
                    "600",
                ],
                ["gateway", "--port", "0", "--mm-processing", "router", *pd],
            ]
    gateways = dict(zip(gw_names, start_all(gw_specs), strict=True))
    workers["qwen-prefill-doomed"].stop(signal.SIGKILL)
    yield {**workers, **{f"gw:{k}": v for k, v in gateways.items()}}
    for proc in [*gateways.values(), *workers.values()]:
        proc.stop()


def client(gateway: Proc) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.address}/v1", api_key="x", max_retries=0)


def messages(n_images: int, seed: int) -> list[dict]:
    parts: list[dict] = [
        {
            "type": "image_url",
            "image_url": {
                "url": "data:image/png;base64," + base64.b64encode(png_bytes(seed + i)).decode()
            },
        }
        for i in range(n_images)
    ]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": "Describe it."}]}]


def ask(gateway: Proc, family: str, msgs: list[dict], n: int = 1, **extra) -> list[tuple[str, str]]:
    extra.setdefault("max_tokens", MAX_TOKENS)
    answer = client(gateway).chat.completions.create(
        model=MODELS[family], messages=msgs, n=n, temperature=0, **extra
    )
    return [(c.message.content or "", c.finish_reason) for c in answer.choices]


def ask_streamed(
    gateway: Proc, family: str, msgs: list[dict], n: int = 1, **extra
) -> list[tuple[str, str]]:
    stream = client(gateway).chat.completions.create(
        model=MODELS[family],
        messages=msgs,
        n=n,
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
        **extra,
    )
    text: dict[int, str] = {i: "" for i in range(n)}
    finish: dict[int, str] = {}
    for chunk in stream:
        for choice in chunk.choices:
            text[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finish[choice.index] = choice.finish_reason
    return [(text[i], finish.get(i, "")) for i in range(n)]


@pytest.mark.parametrize("family", ["qwen", "llava"])
@pytest.mark.parametrize("n_images", [0, 1])
@pytest.mark.parametrize("n", [1, 2])
def test_parallel_matches_aggregated(procs, family: str, n_images: int, n: int) -> None:
    """Text with n = 2 fans out into two pairs; an image request with n = 2 does not."""
    msgs = messages(n_images, seed=300 + n_images)
    expected = ask(procs[f"gw:{family}-agg"], family, msgs, n)
    assert all(finish == "length" for _, finish in expected)
    parallel = procs[f"gw:{family}-parallel"]
    assert ask(parallel, family, msgs, n) == expected
    assert ask_streamed(parallel, family, msgs, n) == expected
    # The aggregated answer streamed is the same too (the comparison is fair).
    assert ask_streamed(procs[f"gw:{family}-agg"], family, msgs, n) == expected


@pytest.mark.parametrize("family", ["qwen", "llava"])
def test_parallel_honours_stop_strings(procs, family: str) -> None:
    msgs = messages(1, seed=320)
    ((full, _),) = ask(procs[f"gw:{family}-agg"], family, msgs)
    assert len(full) >= 4, f"the model's answer is too short to cut: {full!r}"
    stop = full[2:4]  # cuts the answer early: the prefill leg must not swallow the stop
    expected = ask(procs[f"gw:{family}-agg"], family, msgs, stop=[stop])
    assert expected[0][1] == "stop" and len(expected[0][0]) < len(full)
    parallel = procs[f"gw:{family}-parallel"]
    assert ask(parallel, family, msgs, stop=[stop]) == expected
    assert ask_streamed(parallel, family, msgs, stop=[stop]) == expected


@pytest.mark.parametrize("stream", [False, True])
def test_parallel_gateway_on_the_worker_path(procs, stream: bool) -> None:
    msgs = messages(2, seed=330)
    expected = ask(procs["gw:qwen-agg"], "qwen", msgs)
    answer = ask_streamed if stream else ask
    assert answer(procs["gw:qwen-parallel-worker-path"], "qwen", msgs) == expected


@pytest.mark.parametrize("stream", [False, True])
def test_retry_after_a_failed_prefill_start_sends_the_clients_request(procs, stream: bool) -> None:
    """Round robin sends one of every two requests to the dead prefill worker first."""
    gateway = procs["gw:qwen-parallel-retry"]
    answer = ask_streamed if stream else ask
    for seed in (340, 341):
        msgs = [{"role": "user", "content": f"Tell me about {seed}."}]
        assert answer(gateway, "qwen", msgs) == ask(procs["gw:qwen-agg"], "qwen", msgs)
    assert gateway.count("retrying on another pair") >= 1


@pytest.mark.parametrize("gateway", ["gw:qwen-agg", "gw:qwen-parallel", "gw:qwen-sequential"])
def test_logit_bias_steers_every_token(procs, qwen_dir: Path, gateway: str) -> None:
    """+100 on one token makes greedy pick it every time, on every dispatch path."""
    from tandem.gateway.model import ModelHandle

    (token,) = ModelHandle.from_dir(qwen_dir, MODELS["qwen"]).encode("x")
    msgs = messages(1, seed=350)
    ((text, finish),) = ask(procs[gateway], "qwen", msgs, logit_bias={str(token): 100})
    assert (text, finish) == ("x" * MAX_TOKENS, "length")
    ((banned, _),) = ask(procs[gateway], "qwen", msgs, logit_bias={str(token): -100})
    assert "x" not in banned


def test_penalties_change_the_answer_the_same_way_through_pd(procs) -> None:
    msgs = messages(0, seed=360)
    agg = procs["gw:qwen-agg"]
    # Past its end-of-turn token the trained model is unsure of every token, so ±2 on the
    # logits changes its words; within its reply ("Show me a picture.") it would not.
    more = {"extra_body": {"ignore_eos": True}, "max_tokens": 40}
    plain = ask(agg, "qwen", msgs, **more)
    # A negative presence penalty favours tokens already said: the answer turns repetitive.
    repetitive = ask(agg, "qwen", msgs, presence_penalty=-2.0, **more)
    assert repetitive != plain  # the engine honours the penalty
    varied = ask(agg, "qwen", msgs, frequency_penalty=2.0, **more)
    assert varied != plain
    for gateway in ("gw:qwen-parallel", "gw:qwen-sequential"):
        assert ask(procs[gateway], "qwen", msgs, presence_penalty=-2.0, **more) == repetitive
        assert ask(procs[gateway], "qwen", msgs, frequency_penalty=2.0, **more) == varied
