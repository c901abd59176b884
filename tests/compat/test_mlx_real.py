"""A real MLX engine (smg-grpc-servicer 0.14.1 over mlx-lm 0.31.3, mlx's CPU wheel) behind
Tandem's gateway and behind smg 1.13, with the official ``openai`` client.

Why: MLX is the one protocol whose real servicer runs on a CPU lane (mlx_env), so here
Tandem's MLX backend meets the engine it was written for rather than Tandem's own worker.

What runs, once for the module, all on 127.0.0.1:

* the MLX servicer over ``tiny-llava-1.5``'s directory, unmodified (mlx-lm serves LLaVA's
  language model and ignores the vision tower), and over a text-only Qwen3 checkpoint
  derived from ``tiny-qwen3-vl`` (``mlx_procs.derive_text_qwen3``: mlx-lm refuses the VL
  one). Each serves its model under the directory path, so that path is the model id;
* per model, Tandem's gateway in front of it (``--backend auto``: the protocol is found by
  asking, smg's order, MLX last) and, as the reference, a second Tandem gateway in front of
  Tandem's embedded engine (``tandem worker --protocol vllm``) on the same checkpoint. The
  Qwen3 gateway reads the model files from the VL checkpoint (``--model-path``): the derived
  directory's config names a ``qwen3`` model, which Tandem's gateway does not know, while
  its tokenizer and chat template are the VL one's, byte for byte;
* smg 1.13 in front of the LLaVA servicer, launched with nothing MLX-specific: it finds the
  protocol itself (sglang → vllm → trtllm → tokenspeed → mlx) and loads the tokenizer from
  the model id, which is a local directory here (no ``--model-path``, no ``GetTokenizer``).

Greedy agreement with Tandem's engine (``test_greedy_tokens_match_tandems_engine``): MLX and
PyTorch do their float32 arithmetic in different orders, so two engines on the same weights
may rank a near-tie differently. Each answer (32 tokens, past the EOS: ``PAST_EOS``) is
asked with ``logprobs`` and ``top_logprobs: 2``; the tokens must be equal up to the first
position where the embedded engine's top-2 margin is below ``MARGIN`` (1e-3 nats), and so
must their logprobs within ``LOGPROB_TOLERANCE`` (1e-3 nats; the largest gap seen was
≈ 8e-6). At most one of the six ``PROMPTS`` per model and mode may be cut short that way
(``MAY_BE_CUT``); the others compare over every token, and then text and finish reason too.
When this was written all six compared fully on both models (smallest margin 0.07 nats).
Usage must agree with the tokens: the prompt count with the chat template's ids for that
text (rendered here, from the checkpoint), the completion count with the tokens answered.

smg and Tandem over the same servicer must give the same answers, greedy, streamed and not,
logprobs included — but streamed, smg sends no chunk for a token that reads as no text (the
EOS), so its logprobs entry is lost while usage counts it (asserted as smg's deviation).
Both refuse an image with a 400. smg refuses ``n > 1`` and string ``stop`` for MLX (400);
Tandem's gateway serves both — it fans ``n`` out into single-sample requests and applies stop
strings itself — and that is asserted too, as is a client that leaves mid-stream: the
servicer's ``active_requests`` (``GetServerInfo``) falls back to 0 long before the
4000-token answer could have finished, and the gateway's ``Abort`` was answered.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import openai
import pytest
from tests.integration.processes import Proc, start_all
from tests.integration.wire_helpers import chat_prompt_ids, image_data_url

from .mlx_procs import MlxServicer, derive_text_qwen3, start_mlx, wait_until
from .smg_front_procs import Smg, log_problems, stop_all

pytestmark = [pytest.mark.compat, pytest.mark.slow, pytest.mark.timeout(600)]

FAMILIES = ("llava", "qwen")
BUILTIN = {"llava": "tiny-llava-1.5", "qwen": "tiny-qwen3-vl"}
PROMPTS = (
    "Describe the weather today.",
    "Count from one to ten, please.",
    "What colour is the sky?",
    "Tell me a short story.",
    "Name three shapes.",
    "Write a haiku about the sea.",
)
MAX_TOKENS = 32
# Both built-in models answer any text with "Show me a picture." and EOS. Past the EOS the
# tokens depend on the prompt and the margins get thin: that is where engines could part.
PAST_EOS = {"ignore_eos": True}
MARGIN = 1e-3  # nats: below this top-2 margin either engine may pick either token
LOGPROB_TOLERANCE = 1e-3  # nats, the vLLM lane's figure (constrained.TOLERANCE)
MAY_BE_CUT = 1  # prompts per model that may stop comparing at a near-tie
# A streamed answer the client leaves: decoding all of it took 6–9 s on a quiet 2-core
# machine, while the servicer was free 5 ms after the client left.
LONG_ANSWER = 4000  # tokens (the context is 4096)
ABORT_WITHIN_S = 2.0


@dataclass(frozen=True)
class Answer:
    """One choice of a chat completion, read from a whole reply or gathered from a stream."""

    text: str
    finish: str
    tokens: tuple[str, ...]  # the answered tokens, as the logprobs name them
    logprobs: tuple[float, ...]
    margins: tuple[float, ...]  # per position: the best alternative's lead on the second

    @property
    def same_as(self) -> tuple[Any, ...]:
        """What two gateways over the same engine must agree on exactly."""
        return (self.text, self.finish, self.tokens)

    def first_near_tie(self) -> int:
        """The first position whose top-2 margin is below ``MARGIN``; the length if none."""
        return next((i for i, m in enumerate(self.margins) if m < MARGIN), len(self.tokens))


@dataclass(frozen=True)
class Reply:
    """The choices of one request, by index, and its usage."""

    choices: tuple[Answer, ...]
    prompt_tokens: int
    completion_tokens: int

    @property
    def only(self) -> Answer:
        [answer] = self.choices
        return answer

    @property
    def same_as(self) -> tuple[Any, ...]:
        return (*(c.same_as for c in self.choices), self.prompt_tokens, self.completion_tokens)


class Lane:
    """Every process of the module, started in parallel where they can be."""

    def __init__(self, dirs: dict[str, Path], derived_qwen: Path) -> None:
        self.dirs = dirs
        self.servicers: dict[str, MlxServicer] = {}
        self.procs: list[Proc] = []
        self.smg: Smg | None = None
        self.mlx_gateways: dict[str, Proc] = {}  # in front of the MLX servicers
        self.ref_gateways: dict[str, Proc] = {}  # in front of Tandem's embedded engine
        try:
            self._start(derived_qwen)
        except Exception:
            self.stop()
            raise

    def _start(self, derived_qwen: Path) -> None:
        served = {"llava": self.dirs["llava"], "qwen": derived_qwen}
        self.servicers = {family: start_mlx(path) for family, path in served.items()}
        # Tandem's own workers load while the servicers do.
        workers = start_all(
            [
                ["worker", "--model", BUILTIN[f], "--protocol", "vllm", "--log-level", "info"]
                for f in FAMILIES
            ]
        )
        self.procs += workers
        for servicer in self.servicers.values():
            servicer.wait_ready()
        base = ["gateway", "--port", "0", "--log-level", "info", "--backend", "auto"]
        specs = [
            [*base, "--worker-urls", self.servicers["llava"].url],
            [*base, "--worker-urls", self.servicers["qwen"].url],
            [*base, "--worker-urls", f"grpc://{workers[0].address}"],
            [*base, "--worker-urls", f"grpc://{workers[1].address}"],
        ]
        specs[1] += ["--model-path", str(self.dirs["qwen"])]
        # The LLaVA one logs at debug level too: that is where it says it sent an Abort.
        specs[0] += ["--log-level", "debug"]
        gateways = start_all(specs)
        self.procs += gateways
        self.mlx_gateways = dict(zip(FAMILIES, gateways[:2], strict=True))
        self.ref_gateways = dict(zip(FAMILIES, gateways[2:], strict=True))
        llava = self.servicers["llava"]
        # smg's own flags only; "--log-level info" (the last one wins) keeps the line that
        # says where it loaded the tokenizer from.
        self.smg = Smg(
            None,
            None,
            llava.model_id,
            "router",
            ["--worker-urls", llava.url, "--log-level", "info"],
        )

    def model_id(self, family: str) -> str:
        return self.servicers[family].model_id

    def mlx(self, family: str) -> str:
        return f"{self.mlx_gateways[family].address}/v1"

    def reference(self, family: str) -> str:
        return f"{self.ref_gateways[family].address}/v1"

    def assert_servicers_clean(self) -> None:
        for family, servicer in self.servicers.items():
            problems = log_problems(servicer.proc)
            assert not problems, f"the {family} MLX servicer logged errors:\n" + "\n".join(problems)

    def stop(self) -> None:
        if self.smg is not None:
            self.smg.stop()
        stop_all(*self.procs)
        for servicer in self.servicers.values():
            servicer.stop()


@pytest.fixture(scope="module")
def lane(
    llava_dir: Path, qwen_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Lane]:
    derived = derive_text_qwen3(qwen_dir, tmp_path_factory.mktemp("mlx") / "qwen3-text")
    running = Lane({"llava": llava_dir, "qwen": qwen_dir}, derived)
    try:
        yield running
    finally:
        running.stop()


def _client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60)


def _messages(text: str) -> list[dict[str, Any]]:
    # The shape chat_prompt_ids renders, so the expected prompt count is that template's.
    return [{"role": "user", "content": [{"type": "text", "text": text}]}]


def ask(base_url: str, model: str, text: str, stream: bool, **fields: Any) -> Reply:
    """A greedy request with two alternatives per token, streamed (with usage) or not."""
    body: dict[str, Any] = {
        "model": model,
        "messages": _messages(text),
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
        "extra_body": PAST_EOS,
        **fields,
    }
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    entries: dict[int, list[Any]] = {}
    with _client(base_url) as client:
        if stream:
            usage = None
            options = {"include_usage": True}
            for chunk in client.chat.completions.create(
                **body, stream=True, stream_options=options
            ):
                usage = chunk.usage or usage
                for part in chunk.choices:
                    i = part.index
                    texts[i] = texts.get(i, "") + (part.delta.content or "")
                    finishes[i] = part.finish_reason or finishes.get(i, "")
                    entries.setdefault(i, []).extend(_content(part.logprobs))
        else:
            reply = client.chat.completions.create(**body)
            usage = reply.usage
            for whole in reply.choices:
                texts[whole.index] = whole.message.content or ""
                finishes[whole.index] = whole.finish_reason
                entries[whole.index] = _content(whole.logprobs)
    assert usage is not None, "no usage in the reply"
    choices = tuple(_answer(texts[i], finishes[i], entries[i]) for i in sorted(texts))
    return Reply(choices, usage.prompt_tokens, usage.completion_tokens)


def _content(logprobs: Any) -> list[Any]:
    return list(logprobs.content or []) if logprobs is not None else []


def _answer(text: str, finish: str, entries: list[Any]) -> Answer:
    for entry in entries:
        # Greedy: the answered token is the best alternative, and two are listed, best first.
        alternatives = entry.top_logprobs
        assert len(alternatives) == 2, entry
        assert alternatives[0].token == entry.token, entry
        assert alternatives[0].logprob >= alternatives[1].logprob, entry
    return Answer(
        text=text,
        finish=finish,
        tokens=tuple(e.token for e in entries),
        logprobs=tuple(e.logprob for e in entries),
        margins=tuple(e.top_logprobs[0].logprob - e.top_logprobs[1].logprob for e in entries),
    )


# --- 1: Tandem's gateway over the real servicer ---------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_gateway_detects_mlx_and_lists_the_servicers_model(lane: Lane, family: str) -> None:
    gateway, servicer = lane.mlx_gateways[family], lane.servicers[family]
    assert gateway.count(f"worker protocol: mlx (--backend auto, from {servicer.address})") == 1
    info = servicer.model_info()
    assert info.served_model_name == info.model_path == lane.model_id(family)
    with _client(lane.mlx(family)) as client:
        assert [m.id for m in client.models.list().data] == [lane.model_id(family)]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_tokens_match_tandems_engine(lane: Lane, family: str, stream: bool) -> None:
    compared_fully = 0
    for text in PROMPTS:
        ours_reply = ask(lane.mlx(family), lane.model_id(family), text, stream)
        theirs_reply = ask(lane.reference(family), BUILTIN[family], text, stream)
        ours, theirs = ours_reply.only, theirs_reply.only
        cut = theirs.first_near_tie()
        assert ours.tokens[:cut] == theirs.tokens[:cut], text
        for a, b in zip(ours.logprobs[:cut], theirs.logprobs[:cut], strict=True):
            assert abs(a - b) <= LOGPROB_TOLERANCE, (text, ours.logprobs, theirs.logprobs)
        if cut == len(theirs.tokens):
            assert ours.same_as == theirs.same_as, text
            compared_fully += 1
        expected_prompt = len(chat_prompt_ids(lane.dirs[family], text, 0))
        for reply in (ours_reply, theirs_reply):
            assert reply.prompt_tokens == expected_prompt, (text, reply)
            assert reply.completion_tokens == len(reply.only.tokens) > 0, (text, reply)
    assert compared_fully >= len(PROMPTS) - MAY_BE_CUT
    lane.assert_servicers_clean()


# --- 2: smg 1.13 and Tandem's gateway over the same real servicer ----------------------


def test_smg_loads_the_tokenizer_from_the_model_path(lane: Lane) -> None:
    assert lane.smg is not None
    model_id = lane.model_id("llava")
    with _client(lane.smg.base_url) as client:
        assert [m.id for m in client.models.list().data] == [model_id]
    assert lane.smg.proc.count(f"from source: {model_id}") >= 1
    assert lane.smg.proc.count("Successfully loaded tokenizer") >= 1


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_smg_and_tandem_agree_over_the_same_mlx_servicer(lane: Lane, stream: bool) -> None:
    """Token for token, logprobs included, with one deviation of smg's, asserted: streamed,
    a token that reads as no text (the EOS the model says before ``ignore_eos`` lets it go
    on) gets no chunk from smg, so its logprobs entry is lost while its usage still counts
    it. Tandem's stream lists every token it counts."""
    assert lane.smg is not None
    model_id = lane.model_id("llava")
    hidden = _special_tokens(lane.dirs["llava"])
    dropped = 0
    for text in PROMPTS:
        smg = ask(lane.smg.base_url, model_id, text, stream)
        tandem = ask(lane.mlx("llava"), model_id, text, stream)
        assert tandem.completion_tokens == len(tandem.only.tokens)
        if stream:
            dropped += len(tandem.only.tokens) - len(smg.only.tokens)
            tandem = replace(tandem, choices=(_without(tandem.only, hidden),))
        assert smg.same_as == tandem.same_as, text
        # One engine's numbers, printed by two gateways: equal up to their float formatting.
        for a, b in zip(smg.only.logprobs, tandem.only.logprobs, strict=True):
            assert abs(a - b) <= 1e-5, (text, smg.only.logprobs, tandem.only.logprobs)
    if stream:  # each answer holds an EOS or two: smg's lists lacked exactly those
        assert dropped >= len(PROMPTS)
    lane.assert_servicers_clean()


def _special_tokens(model_dir: Path) -> frozenset[str]:
    """The texts of the tokenizer's special tokens (EOS and the like)."""
    added = json.loads((model_dir / "tokenizer.json").read_text())["added_tokens"]
    return frozenset(t["content"] for t in added if t.get("special"))


def _without(answer: Answer, hidden: frozenset[str]) -> Answer:
    """``answer`` with the logprobs entries of the ``hidden`` tokens left out."""
    keep = [i for i, token in enumerate(answer.tokens) if token not in hidden]
    return replace(
        answer,
        tokens=tuple(answer.tokens[i] for i in keep),
        logprobs=tuple(answer.logprobs[i] for i in keep),
        margins=tuple(answer.margins[i] for i in keep),
    )


def test_smg_and_tandem_both_refuse_an_image(lane: Lane) -> None:
    assert lane.smg is not None
    model_id = lane.model_id("llava")
    parts = [
        {"type": "image_url", "image_url": {"url": image_data_url(5)}},
        {"type": "text", "text": "What is in this picture?"},
    ]
    for name, url in {"smg": lane.smg.base_url, "tandem": lane.mlx("llava")}.items():
        with _client(url) as client, pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(
                model=model_id,
                messages=[{"role": "user", "content": parts}],
                max_tokens=4,
                temperature=0,
            )
        assert caught.value.status_code == 400, name
        if name == "tandem":
            assert caught.value.body["code"] == "multimodal_not_supported"
        else:
            assert "does not support image inputs" in caught.value.message
    assert lane.servicers["llava"].active_requests() == 0
    lane.assert_servicers_clean()


# --- 3: what Tandem's gateway relies on the real servicer for --------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_n2_fans_out_where_smg_refuses(lane: Lane, stream: bool) -> None:
    model_id, text = lane.model_id("llava"), PROMPTS[0]
    single = ask(lane.mlx("llava"), model_id, text, stream)
    pair = ask(lane.mlx("llava"), model_id, text, stream, n=2)
    assert [c.same_as for c in pair.choices] == [single.only.same_as] * 2
    # The prompt is charged once, the completions summed over the choices.
    assert pair.prompt_tokens == single.prompt_tokens
    assert pair.completion_tokens == 2 * single.completion_tokens
    assert lane.smg is not None
    with _client(lane.smg.base_url) as client, pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=model_id, messages=_messages(text), max_tokens=4, temperature=0, n=2
        )
    assert "n > 1" in caught.value.message
    lane.assert_servicers_clean()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_stop_strings_are_applied_by_tandem_where_smg_refuses(lane: Lane, stream: bool) -> None:
    model_id, text = lane.model_id("llava"), PROMPTS[1]
    free = ask(lane.mlx("llava"), model_id, text, stream).only
    middle = len(free.text) // 2
    stop = free.text[middle : middle + 2]
    assert stop.strip(), free.text  # a visible cut, not whitespace the template may add
    stopped = ask(lane.mlx("llava"), model_id, text, stream, stop=[stop]).only
    assert stopped.text == free.text[: free.text.index(stop)]
    assert stopped.finish == "stop"
    assert lane.smg is not None
    with _client(lane.smg.base_url) as client, pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=model_id, messages=_messages(text), max_tokens=4, temperature=0, stop=[stop]
        )
    assert "string stop sequences" in caught.value.message
    lane.assert_servicers_clean()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_max_tokens_cut_is_length(lane: Lane, stream: bool) -> None:
    model_id, text = lane.model_id("llava"), PROMPTS[2]
    full = ask(lane.mlx("llava"), model_id, text, stream)
    assert len(full.only.tokens) > 3, full
    cut = ask(lane.mlx("llava"), model_id, text, stream, max_tokens=3)
    assert (cut.only.finish, cut.completion_tokens) == ("length", 3)
    assert cut.only.tokens == full.only.tokens[:3]
    assert full.only.text.startswith(cut.only.text)


def _aborts(gateway: Proc, on: str) -> int:
    """The ``Abort`` calls ``gateway`` logged as answered by the worker ``on`` names."""
    return sum("aborted " in line and line.endswith(on) for line in list(gateway.lines))


def test_client_disconnect_frees_the_servicer(lane: Lane) -> None:
    servicer, model_id = lane.servicers["llava"], lane.model_id("llava")
    before = ask(lane.mlx("llava"), model_id, PROMPTS[0], stream=False)
    assert servicer.active_requests() == 0
    aborts_before = _aborts(lane.mlx_gateways["llava"], f"on {servicer.address}")
    with _client(lane.mlx("llava")) as client:
        stream = client.chat.completions.create(
            model=model_id,
            messages=_messages(PROMPTS[3]),
            max_tokens=LONG_ANSWER,
            temperature=0,
            stream=True,
            extra_body=PAST_EOS,  # else the model's own reply ends first
        )
        first = next(iter(stream))  # maybe only the role: the gateway may send it first
        assert first.choices, first
        # It is decoding for us (the count rises once the request entered the batch).
        assert wait_until(lambda: servicer.active_requests() == 1, ABORT_WITHIN_S)
        stream.close()
    assert wait_until(lambda: servicer.active_requests() == 0, ABORT_WITHIN_S), (
        f"the servicer still serves the request {ABORT_WITHIN_S}s after the client left"
    )
    gateway = lane.mlx_gateways["llava"]
    on = f"on {servicer.address}"
    assert wait_until(lambda: _aborts(gateway, on) == aborts_before + 1, ABORT_WITHIN_S)
    assert gateway.count("abort of") == 0  # "abort of … failed": the servicer refused it
    # The servicer is free, and the next request answers as before.
    assert ask(lane.mlx("llava"), model_id, PROMPTS[0], stream=False).same_as == before.same_as
    lane.assert_servicers_clean()
