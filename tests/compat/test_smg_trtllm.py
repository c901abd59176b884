"""smg 1.13.0 (the Rust reference gateway) and Tandem's gateway in front of the same Tandem
worker speaking TensorRT-LLM's protocol (``trtllm.TrtllmService``): the same greedy answers.

Why: real TensorRT-LLM engines need CUDA, so Tandem's worker speaks the protocol and smg is
the independent check that it reads what smg sends as smg means it: smg finds the protocol
itself (it asks sglang → vllm → trtllm; the worker serves only TensorRT-LLM's service),
takes the tokenizer over GetTokenizer, preprocesses images in its own code only to expand
each placeholder run, and sends the images' source bytes beside the expanded ids. Each case
is answered by smg and by Tandem over the same worker and must agree, streamed and not; the
worker's side is checked too: image bytes arrive, no pixel tensors, no errors in its log.

Where smg and Tandem differ, asserted:

* String ``stop``: smg sends it (a TensorRT-LLM engine tokenizes it); Tandem's worker does
  not detokenize and refuses it by name, so smg answers 400 where Tandem's gateway, which
  applies stop strings itself, answers.
* ``max_tokens`` unset: smg sends 2048 whatever the context; the worker clamps it to what
  the context leaves, so the answer is the same as Tandem's (which sends that itself).
* tiny-llava-1.5 images: smg sizes a LLaVA image's placeholder run from a patch size it
  reads in one file only (tests/compat/test_smg_front.py asserts that bug), 16 tokens of
  the 64 the model needs; the worker refuses the run by name (text is served).
"""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from PIL import Image
from tests.integration.processes import Proc, start_all

from .smg_front_procs import Smg, leg, log_problems, stop_all, worker_stats

pytestmark = [pytest.mark.compat, pytest.mark.slow]

QWEN, LLAVA = "tiny-qwen3-vl", "tiny-llava-1.5"
MAX_TOKENS = 8


def _png(colour: tuple[int, int, int], size: tuple[int, int]) -> str:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


# Two sizes: the images' grids (and so their placeholder runs) differ.
IMAGES = [_png((200, 30, 90), (64, 48)), _png((20, 160, 220), (48, 64))]


def _messages(n_images: int, text: str = "What is in this picture?") -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [
        {"type": "image_url", "image_url": {"url": url}} for url in IMAGES[:n_images]
    ]
    parts.append({"type": "text", "text": text})
    return [{"role": "user", "content": parts}]


class Fleet:
    """One TensorRT-LLM-protocol worker of ``model`` and the gateways in front of it."""

    def __init__(self, model: str, model_dir: Path, tandem: bool = True) -> None:
        args = ["worker", "--model", model, "--protocol", "trtllm", "--log-level", "info"]
        [self.worker] = start_all([args])
        urls = ["--worker-urls", f"grpc://{self.worker.address}"]
        self.tandem: Proc | None = None
        self.smg: Smg | None = None
        try:
            if tandem:
                [self.tandem] = start_all([["gateway", "--port", "0", *urls]])
            # GetModelInfo names no tokenizer path in this protocol, and smg 1.13 takes a
            # tokenizer from a worker label or its own flag only: it is given the files.
            self.smg = Smg(None, None, model, "router", ["--model-path", str(model_dir), *urls])
        except Exception:
            self.stop()
            raise

    def gateways(self) -> dict[str, str]:
        urls = {"tandem": f"{self.tandem.address}/v1"} if self.tandem else {}
        assert self.smg is not None
        return {**urls, "smg": self.smg.base_url}

    def assert_worker_clean(self) -> None:
        problems = log_problems(self.worker)
        assert not problems, "the worker logged errors:\n" + "\n".join(problems)

    def stop(self) -> None:
        if self.smg is not None:
            self.smg.stop()
        stop_all(*([self.tandem] if self.tandem else []), self.worker)


def _fleet(model: str, model_dir: Path, tandem: bool = True) -> Iterator[Fleet]:
    fleet = Fleet(model, model_dir, tandem)
    try:
        yield fleet
    finally:
        fleet.stop()


@pytest.fixture(scope="module")
def fleet(qwen_dir: Path) -> Iterator[Fleet]:
    yield from _fleet(QWEN, qwen_dir)


@pytest.fixture(scope="module")
def llava_fleet(llava_dir: Path) -> Iterator[Fleet]:
    yield from _fleet(LLAVA, llava_dir, tandem=False)


def _client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60)


def _answer(
    base_url: str, n_images: int, stream: bool, model: str = QWEN, **fields: Any
) -> list[tuple[str, str]]:
    """Each choice's text and finish reason."""
    fields = {"max_tokens": MAX_TOKENS, "temperature": 0, **fields}
    with _client(base_url) as client:
        reply = client.chat.completions.create(
            model=model, messages=_messages(n_images), stream=stream, **fields
        )
        if not stream:
            return [(c.message.content or "", c.finish_reason) for c in reply.choices]
        texts: dict[int, str] = {}
        finishes: dict[int, str] = {}
        for chunk in reply:
            for choice in chunk.choices:
                texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
                finishes[choice.index] = choice.finish_reason or finishes.get(choice.index, "")
        return [(texts[i], finishes[i]) for i in sorted(texts)]


@pytest.mark.parametrize("n_images", [0, 1, 2])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_smg_and_tandem_agree_over_the_same_worker(
    fleet: Fleet, n_images: int, stream: bool
) -> None:
    answers = {name: _answer(url, n_images, stream) for name, url in fleet.gateways().items()}
    assert answers["tandem"][0][0], answers
    assert answers["smg"] == answers["tandem"]
    fleet.assert_worker_clean()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_n_2_is_two_sequences_of_one_request_on_both(fleet: Fleet, stream: bool) -> None:
    answers = {name: _answer(url, 1, stream, n=2) for name, url in fleet.gateways().items()}
    [single] = _answer(fleet.gateways()["tandem"], 1, stream=False)
    assert answers == {"tandem": [single, single], "smg": [single, single]}
    fleet.assert_worker_clean()


def test_logprobs_agree(fleet: Fleet) -> None:
    tops = {}
    for name, url in fleet.gateways().items():
        with _client(url) as client:
            reply = client.chat.completions.create(
                model=QWEN,
                messages=_messages(1),
                max_tokens=MAX_TOKENS,
                temperature=0,
                logprobs=True,
                top_logprobs=2,
            )
        content = reply.choices[0].logprobs.content
        tops[name] = [(t.token, [a.token for a in t.top_logprobs]) for t in content]
        values = [t.logprob for t in content]
        assert all(v <= 0 for v in values), name
    assert tops["smg"] == tops["tandem"] and tops["tandem"]


def test_an_unset_max_tokens_is_served_alike(fleet: Fleet) -> None:
    """smg sends 2048 (above this model's context); the worker clamps it."""
    answers = {
        name: _answer(url, 0, stream=False, max_tokens=None)
        for name, url in fleet.gateways().items()
    }
    assert answers["smg"] == answers["tandem"] and answers["tandem"][0][1] == "stop"
    fleet.assert_worker_clean()


def test_smg_sends_the_image_bytes_and_no_pixels(fleet: Fleet) -> None:
    before = worker_stats(fleet.worker)
    _answer(fleet.gateways()["smg"], 2, stream=False)
    after = worker_stats(fleet.worker)
    grown = {k: leg(after, "aggregated")[k] - leg(before, "aggregated")[k] for k in ("requests",)}
    assert grown == {"requests": 1}
    sent = after["leg_bytes"]["aggregated"]
    assert sent.get("image_bytes", 0) > before["leg_bytes"].get("aggregated", {}).get(
        "image_bytes", 0
    )
    assert sent.get("pixel_bytes", 0) == 0  # no pixel tensors travel on this protocol
    fleet.assert_worker_clean()


def test_smg_sends_stop_strings_which_the_worker_refuses(fleet: Fleet) -> None:
    for name, url in fleet.gateways().items():
        if name == "tandem":
            assert _answer(url, 0, stream=False, stop=["zzz"])[0][0]
            continue
        with pytest.raises(openai.BadRequestError) as caught:
            _answer(url, 0, stream=False, stop=["zzz"])
        assert "stop: this worker does not detokenize" in caught.value.message
    fleet.assert_worker_clean()


def test_smg_llava_image_runs_are_refused_by_name(llava_fleet: Fleet) -> None:
    smg = llava_fleet.gateways()["smg"]
    assert _answer(smg, 0, stream=False, model=LLAVA)[0][0]  # text is served
    with pytest.raises(openai.BadRequestError) as caught:
        _answer(smg, 1, stream=False, model=LLAVA)
    assert "expands to 64 image tokens" in caught.value.message
    llava_fleet.assert_worker_clean()
