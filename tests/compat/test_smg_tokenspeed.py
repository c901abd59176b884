"""smg 1.13.0 (the Rust reference gateway) and Tandem's gateway in front of the same Tandem
workers speaking TokenSpeed's protocol, aggregated, PD and E/P/D: the same greedy answers.

Why: real TokenSpeed engines need GPUs, so Tandem's worker speaks the protocol and smg is
the independent check that it reads what smg sends as smg means it: smg detects the
protocol itself, takes the tokenizer over GetTokenizer, preprocesses images in its own code
and writes one ``MultimodalItem`` per image (its own pixel rows, in the dtype the worker's
``multimodal_encoder_dtype`` names, its ``image_grid_thw`` row, its placeholder range),
sends both PD legs at once with an int64 KV room and, under E/P/D, one ``Encode`` per image
to the encode worker with that image's room. Each case is answered by smg and by Tandem
over the same workers and must agree token for token, streamed and not; the workers' side
is checked too: no pixel bytes on the decode leg, none on the prefill leg under E/P/D
(where only the encode worker runs the vision tower, one accepted ``Encode`` per image),
the prefill's KV released, no errors in the workers' logs.

smg is launched as the reference says, with nothing TokenSpeed-specific: no ``--backend``
(over gRPC it only pins a ZMQ runtime; smg finds ``tokenspeed`` by probing sglang → vllm →
trtllm → tokenspeed), and each bootstrap port after its URL, the one its worker was
started with (``--disaggregation-bootstrap-port``): smg names that port, else 8998, in
``kv_bootstrap_info`` and ``encode_bootstrap_info``.

Where smg and Tandem differ, asserted:

* String ``stop``: smg sends it to TokenSpeed workers (a TokenSpeed engine detokenizes);
  Tandem's worker never detokenizes and refuses it by name, so smg answers 400 where
  Tandem's gateway, which applies stop strings itself, answers.
* tiny-llava-1.5 images: smg sizes a LLaVA image's placeholder run from a patch size it
  reads in one file only (tests/compat/test_smg_front.py asserts that bug), 16 tokens of
  the 64 the model needs, so LLaVA is checked for that refusal only (text is served). Under
  E/P/D this once answered 504 after 3 s: the encode worker refused the ``Encode`` and
  smg only logs that, the prefill waited for an embedding that never came, and smg gives
  up on a prefill silent for 3 s. The prefill now refuses the prompt before it waits
  (tests/unit/worker/tokenspeed/test_worker_tokenspeed_epd.py), so every mode says why.
"""

from __future__ import annotations

import base64
import io
import json
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

QWEN, LLAVA = "tiny-qwen3-vl", "tiny-llava-1.5"
SMG_LLAVA_PATCH = 14  # smg's LLaVA patch size when preprocessor_config.json has none
MAX_TOKENS = 8


def _png(colour: tuple[int, int, int], size: tuple[int, int]) -> str:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


# Two sizes: the items' grids (and so their rows and token runs) differ.
IMAGES = [_png((200, 30, 90), (64, 48)), _png((20, 160, 220), (48, 64))]


def _messages(n_images: int) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [
        {"type": "image_url", "image_url": {"url": url}} for url in IMAGES[:n_images]
    ]
    parts.append({"type": "text", "text": "What is in this picture?"})
    return [{"role": "user", "content": parts}]


class Fleet:
    """TokenSpeed-protocol workers of ``model`` (both, prefill, decode, encode), and smg
    launches (and, with ``tandem``, Tandem gateways) over the same ones."""

    def __init__(self, model: str, tandem: bool = True) -> None:
        self.prefill_port, self.encode_port = free_port(), free_port()
        base = ["worker", "--model", model, "--protocol", "tokenspeed", "--log-level", "info"]
        boot = "--disaggregation-bootstrap-port"
        self.both, self.prefill, self.decode, self.encode = start_all(
            [
                [*base, "--role", "both"],
                [*base, "--role", "prefill", boot, str(self.prefill_port)],
                [*base, "--role", "decode"],
                [*base, "--role", "encode", boot, str(self.encode_port)],
            ]
        )
        pd = ["--prefill", f"grpc://{self.prefill.address}", str(self.prefill_port)]
        pd += ["--decode", f"grpc://{self.decode.address}"]
        encode = ["--encode", f"grpc://{self.encode.address}", str(self.encode_port)]
        modes = {
            "agg": ["--worker-urls", f"grpc://{self.both.address}"],
            "pd": ["--pd-disaggregation", *pd],
            "epd": ["--epd-disaggregation", *encode, *pd],
        }
        # Tandem's gateway takes smg's flags; it finds the protocol itself too.
        specs = [["gateway", "--port", "0", *args] for args in modes.values()] if tandem else []
        self.tandem: dict[str, Proc] = {}
        self.smgs: dict[str, Smg] = {}
        try:
            self.tandem = dict(zip([f"tandem-{m}" for m in modes], start_all(specs), strict=False))
            for mode, args in modes.items():
                self.smgs[f"smg-{mode}"] = Smg(None, None, model, "router", args)
        except Exception:
            self.stop()
            raise

    def gateways(self) -> dict[str, str]:
        urls = {name: f"{proc.address}/v1" for name, proc in self.tandem.items()}
        return {**urls, **{name: smg.base_url for name, smg in self.smgs.items()}}

    def workers(self) -> tuple[Proc, Proc, Proc, Proc]:
        return self.both, self.prefill, self.decode, self.encode

    def assert_workers_clean(self) -> None:
        for proc in self.workers():
            problems = log_problems(proc)
            assert not problems, f"{proc.args[:9]} logged errors:\n" + "\n".join(problems)

    def stop(self) -> None:
        for smg in self.smgs.values():
            smg.stop()
        stop_all(*self.tandem.values(), *self.workers())


def _fleet(model: str, tandem: bool = True) -> Iterator[Fleet]:
    fleet = Fleet(model, tandem)
    try:
        yield fleet
    finally:
        fleet.stop()


@pytest.fixture(scope="module")
def fleet(qwen_dir: Path) -> Iterator[Fleet]:
    yield from _fleet(QWEN)


@pytest.fixture(scope="module")
def llava_fleet(llava_dir: Path) -> Iterator[Fleet]:
    yield from _fleet(LLAVA, tandem=False)


def _client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60)


def _answer(
    base_url: str, n_images: int, stream: bool, model: str = QWEN, **fields: Any
) -> tuple[str, str]:
    with _client(base_url) as client:
        reply = client.chat.completions.create(
            model=model,
            messages=_messages(n_images),
            max_tokens=MAX_TOKENS,
            temperature=0,
            stream=stream,
            **fields,
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
def test_smg_and_tandem_agree_over_the_same_tokenspeed_workers(
    fleet: Fleet, n_images: int, stream: bool
) -> None:
    answers = {name: _answer(url, n_images, stream) for name, url in fleet.gateways().items()}
    expected = answers["tandem-agg"]
    assert expected[0], answers
    assert answers == dict.fromkeys(answers, expected)
    fleet.assert_workers_clean()


def _grown(before: dict[str, Any], after: dict[str, Any], name: str) -> dict[str, int]:
    return {k: leg(after, name)[k] - leg(before, name)[k] for k in ("requests", "pixel_bytes")}


def test_smg_pd_puts_no_pixels_on_the_decode_leg_and_frees_the_kv(fleet: Fleet) -> None:
    before = worker_stats(fleet.prefill), worker_stats(fleet.decode)
    _answer(fleet.smgs["smg-pd"].base_url, 2, stream=False)
    after = worker_stats(fleet.prefill), worker_stats(fleet.decode)
    prefill, decode = _grown(before[0], after[0], "prefill"), _grown(before[1], after[1], "decode")
    assert prefill["requests"] == 1 and prefill["pixel_bytes"] > 0
    assert decode == {"requests": 1, "pixel_bytes": 0}
    assert after[0]["held_kv_blocks"] == 0
    fleet.assert_workers_clean()


def test_smg_epd_sends_pixels_to_the_encode_worker_only(fleet: Fleet) -> None:
    workers = fleet.prefill, fleet.decode, fleet.encode
    p0, d0, e0 = (worker_stats(w) for w in workers)
    _answer(fleet.smgs["smg-epd"].base_url, 2, stream=False)
    p1, d1, e1 = (worker_stats(w) for w in workers)
    assert _grown(p0, p1, "prefill") == {"requests": 1, "pixel_bytes": 0}
    assert _grown(d0, d1, "decode") == {"requests": 1, "pixel_bytes": 0}
    # Neither the prefill nor the decode worker ran a vision tower: the encode worker did.
    assert (p1["vision_encodes"], d1["vision_encodes"]) == (
        p0["vision_encodes"],
        d0["vision_encodes"],
    )
    assert e1["encode_requests"]["accepted"] - e0["encode_requests"]["accepted"] == 2
    assert e1["embedding_store"]["held"] == 0  # both embeddings were pulled
    assert p1["held_kv_blocks"] == 0
    fleet.assert_workers_clean()


def test_smg_sends_stop_strings_which_the_worker_refuses(fleet: Fleet) -> None:
    """smg's deviation by design: it sends TokenSpeed's ``stop`` strings to the worker (a
    TokenSpeed engine detokenizes); Tandem's worker does not, and says so (400), while
    Tandem's gateway applies them itself."""
    for name, url in fleet.gateways().items():
        if name.startswith("tandem-"):
            assert _answer(url, 0, stream=False, stop=["zzz"])[0], name
            continue
        with pytest.raises(openai.BadRequestError) as caught:
            _answer(url, 0, stream=False, stop=["zzz"])
        assert "sampling_params.stop: this worker does not detokenize" in caught.value.message
    assert worker_stats(fleet.prefill)["held_kv_blocks"] == 0
    fleet.assert_workers_clean()


def test_smg_llava_image_is_refused_alike_in_every_mode(
    llava_fleet: Fleet, llava_dir: Path
) -> None:
    """smg's LLaVA bug (module docstring) under TokenSpeed: the same 400 with the reason
    in every mode. Under E/P/D the encode worker refuses the ``Encode``, and the prefill
    refuses the prompt before it waits for the embedding; were it to wait, smg would give
    up on it after 3 s with a 504 (``prefill_worker_silent``)."""
    vision = json.loads((llava_dir / "config.json").read_text())["vision_config"]
    sent, need = (
        (vision["image_size"] // SMG_LLAVA_PATCH) ** 2,
        (vision["image_size"] // vision["patch_size"]) ** 2,
    )
    assert sent != need
    before = worker_stats(llava_fleet.encode)["encode_requests"]
    for name, url in llava_fleet.gateways().items():
        assert _answer(url, 0, stream=False, model=LLAVA)[0], name  # text is served
        with pytest.raises(openai.BadRequestError) as caught:
            _answer(url, 1, stream=False, model=LLAVA)
        reason = f"the prompt has {sent} image tokens but its 1 image(s) need {need}"
        assert reason in caught.value.message, name
    after = worker_stats(llava_fleet.encode)["encode_requests"]
    assert (after["accepted"], after["refused"]) == (before["accepted"], before["refused"] + 1)
    assert worker_stats(llava_fleet.prefill)["held_kv_blocks"] == 0
    llava_fleet.assert_workers_clean()
