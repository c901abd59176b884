"""smg 1.13.0 (the Rust reference gateway) and Tandem's gateway in front of the same Tandem
workers speaking SGLang's protocol, aggregated and PD: the same greedy answers.

Why: real SGLang engines need GPUs, so Tandem's worker speaks the protocol and smg is the
independent check that it does so as smg expects (smg detects the protocol itself, takes
the tokenizer over GetTokenizer, preprocesses images in its own code, sends both PD legs at
once with a bootstrap room). Each case is answered by smg and by Tandem over the same
workers and must agree token for token, streamed and not; the workers' side is checked
too: no errors in their logs, no pixel bytes on the decode leg, the room's KV released.

tiny-qwen3-vl only: smg sizes a LLaVA image's placeholder run from a patch size it reads
in one file only (tests/compat/test_smg_front.py asserts that bug), which is about smg's
preprocessing, not the protocol.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from bench.procs import free_port
from PIL import Image
from tests.integration.processes import Proc, start_all

from .smg_front_procs import Smg, leg, log_problems, stop_all, worker_stats

pytestmark = [pytest.mark.compat, pytest.mark.slow]

QWEN = "tiny-qwen3-vl"
MAX_TOKENS = 8


def _png(colour: tuple[int, int, int], size: tuple[int, int]) -> str:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


IMAGES = [_png((200, 30, 90), (64, 48)), _png((20, 160, 220), (48, 64))]


def _messages(n_images: int) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [
        {"type": "image_url", "image_url": {"url": url}} for url in IMAGES[:n_images]
    ]
    parts.append({"type": "text", "text": "What is in this picture?"})
    return [{"role": "user", "content": parts}]


class Fleet:
    """SGLang-protocol workers, Tandem gateways and smg launches over them."""

    def __init__(self) -> None:
        self.bootstrap_port = free_port()
        base = ["worker", "--model", QWEN, "--protocol", "sglang", "--log-level", "info"]
        self.both, self.prefill, self.decode = start_all(
            [
                [*base, "--role", "both"],
                [
                    *base,
                    "--role",
                    "prefill",
                    "--disaggregation-bootstrap-port",
                    str(self.bootstrap_port),
                ],
                [*base, "--role", "decode"],
            ]
        )
        pd = ["--pd-disaggregation", "--prefill", f"grpc://{self.prefill.address}"]
        pd_tail = [str(self.bootstrap_port), "--decode", f"grpc://{self.decode.address}"]
        self.tandem_agg, self.tandem_pd = start_all(
            [
                ["gateway", "--port", "0", "--worker-urls", self.both.address],
                ["gateway", "--port", "0", *pd, *pd_tail],
            ]
        )
        self.smg_agg = Smg(
            None, None, QWEN, "router", ["--worker-urls", f"grpc://{self.both.address}"]
        )
        self.smg_pd = Smg(None, None, QWEN, "router", [*pd, *pd_tail])

    def gateways(self) -> dict[str, str]:
        return {
            "tandem-agg": f"{self.tandem_agg.address}/v1",
            "tandem-pd": f"{self.tandem_pd.address}/v1",
            "smg-agg": self.smg_agg.base_url,
            "smg-pd": self.smg_pd.base_url,
        }

    def workers(self) -> tuple[Proc, Proc, Proc]:
        return self.both, self.prefill, self.decode

    def stop(self) -> None:
        self.smg_agg.stop()
        self.smg_pd.stop()
        stop_all(self.tandem_agg, self.tandem_pd, *self.workers())


@pytest.fixture(scope="module")
def fleet(qwen_dir: Path) -> Iterator[Fleet]:
    fleet = Fleet()
    try:
        yield fleet
    finally:
        fleet.stop()


def _answer(base_url: str, n_images: int, stream: bool) -> tuple[str, str]:
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60)
    with client:
        reply = client.chat.completions.create(
            model=QWEN,
            messages=_messages(n_images),
            max_tokens=MAX_TOKENS,
            temperature=0,
            stream=stream,
        )
        if not stream:
            choice = reply.choices[0]
            return choice.message.content or "", choice.finish_reason
        text, finish = "", ""
        for chunk in reply:
            for choice in chunk.choices:
                text += choice.delta.content or ""
                finish = choice.finish_reason or finish
        return text, finish


@pytest.mark.parametrize("n_images", [0, 1, 2])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_smg_and_tandem_agree_over_the_same_sglang_workers(
    fleet: Fleet, n_images: int, stream: bool
) -> None:
    answers = {name: _answer(url, n_images, stream) for name, url in fleet.gateways().items()}
    expected = answers["tandem-agg"]
    assert expected[0], answers
    assert answers == dict.fromkeys(answers, expected)


def test_smg_pd_puts_no_pixels_on_the_decode_leg_and_frees_the_room(fleet: Fleet) -> None:
    before = worker_stats(fleet.prefill), worker_stats(fleet.decode)
    _answer(fleet.smg_pd.base_url, 2, stream=False)
    after = worker_stats(fleet.prefill), worker_stats(fleet.decode)
    grown = [
        {k: leg(a, name)[k] - leg(b, name)[k] for k in ("requests", "pixel_bytes")}
        for a, b, name in ((after[0], before[0], "prefill"), (after[1], before[1], "decode"))
    ]
    assert grown[0]["requests"] == 1 and grown[0]["pixel_bytes"] > 0
    assert grown[1] == {"requests": 1, "pixel_bytes": 0}
    assert after[0]["held_kv_blocks"] == 0
    for proc in fleet.workers():
        problems = log_problems(proc)
        assert not problems, f"{proc.args[:6]} logged errors:\n" + "\n".join(problems)
