"""Structured outputs, logprobs and logit_bias end to end: openai client → gateway → workers.

Per built-in model an aggregated worker and a prefill/decode pair, with gateways over them:
aggregated, PD sequential on the router media path, PD parallel, PD on the worker media path
(Qwen), and PD with a language-model-only decode worker (LLaVA, whose image requests that
worker can decode from KV). Every constrained answer is checked against its constraint, and
every PD answer (text, finish reason, logprobs) must equal the aggregated one, streamed and
not: the constraint and the logprob request ride on the decode leg (docs/pd-contract.md §20).

The built-in models were trained on pictures of shapes and little JSON (engine/builtin_shapes.py),
so the schemas are bounded (enums, small integer ranges, no extra properties) and an open
grammar (``json_object``) is checked for a valid start.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import jsonschema_rs
import openai
import pytest

from .image_server import png_bytes
from .processes import Proc, start_all

pytestmark = pytest.mark.slow

MODELS = {"qwen": "tiny-qwen3-vl", "llava": "tiny-llava-1.5"}
SCHEMA = {
    "type": "object",
    "properties": {
        "colour": {"enum": ["red", "green", "blue"]},
        "size": {"type": "integer", "minimum": 1, "maximum": 9},
    },
    "required": ["colour", "size"],
    "additionalProperties": False,
}
REGEX = r"(cat|dog)-[0-9]{2}"
CHOICES = ["sunny", "cloudy", "rainy"]
MAX_TOKENS = 96
# No bias against whitespace: the workers' JSON grammars are compact by default (worker
# --json-whitespace), so a bounded schema finishes by itself.
CONSTRAINTS: dict[str, dict[str, Any]] = {
    "json_schema": {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "thing", "schema": SCHEMA, "strict": True},
        },
    },
    "regex": {"extra_body": {"structured_outputs": {"regex": REGEX}}},
    "choice": {"extra_body": {"guided_choice": CHOICES}},
    "json_object": {"response_format": {"type": "json_object"}},
}
# The PD deployments of each model that must answer as its aggregated worker does.
PD_GATEWAYS = {
    "qwen": ["pd", "parallel", "pd-worker-path"],
    "llava": ["pd", "parallel", "lmo"],
}


@pytest.fixture(scope="module")
def procs(model_cache: Path):
    names, specs = [], []
    for family, model in MODELS.items():
        for role in ("both", "prefill", "decode"):
            names.append(f"{family}-{role}")
            specs.append(["worker", "--model", model, "--role", role])
    names.append("llava-decode-lmo")
    specs.append(
        ["worker", "--model", MODELS["llava"], "--role", "decode", "--language-model-only"]
    )
    workers = dict(zip(names, start_all(specs), strict=True))
    gw_names, gw_specs = [], []
    for family in MODELS:
        agg, prefill, decode = (
            workers[f"{family}-{r}"].address for r in ("both", "prefill", "decode")
        )
        pd = ["--pd-disaggregation", "--prefill", prefill, "--decode", decode]
        router = ["gateway", "--port", "0", "--mm-processing", "router"]
        gw_names += [f"{family}-agg", f"{family}-pd", f"{family}-parallel"]
        gw_specs += [
            [*router, "--worker-urls", agg],
            [*router, *pd],
            [*router, *pd, "--pd-dispatch", "parallel"],
        ]

    def pd_gateway(media: str, prefill: str, decode: str) -> list[str]:
        legs = ["--prefill", workers[prefill].address, "--decode", workers[decode].address]
        return ["gateway", "--port", "0", "--mm-processing", media, "--pd-disaggregation", *legs]

    gw_names += ["qwen-pd-worker-path", "llava-lmo"]
    gw_specs += [
        pd_gateway("worker", "qwen-prefill", "qwen-decode"),
        pd_gateway("router", "llava-prefill", "llava-decode-lmo"),
    ]
    gateways = dict(zip(gw_names, start_all(gw_specs), strict=True))
    yield gateways
    for proc in [*gateways.values(), *workers.values()]:
        proc.stop()


def client(gateway: Proc) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.address}/v1", api_key="x", max_retries=0)


def messages(image_seed: int | None) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    if image_seed is not None:
        url = "data:image/png;base64," + base64.b64encode(png_bytes(image_seed)).decode()
        parts.append({"type": "image_url", "image_url": {"url": url}})
    parts.append({"type": "text", "text": "Describe the picture."})
    return [{"role": "user", "content": parts}]


def ask(gateway: Proc, family: str, stream: bool = False, **kwargs: Any) -> dict[str, Any]:
    """One greedy chat answer as {text, finish, logprobs} (logprobs as plain dicts)."""
    request = {
        "model": MODELS[family],
        "messages": messages(kwargs.pop("image_seed", 7)),
        "max_tokens": kwargs.pop("max_tokens", MAX_TOKENS),
        "temperature": 0,
        **kwargs,
    }
    api = client(gateway)
    if not stream:
        choice = api.chat.completions.create(**request).choices[0]
        content = choice.logprobs.content if choice.logprobs else None
        return {
            "text": choice.message.content or "",
            "finish": choice.finish_reason,
            "logprobs": [e.model_dump() for e in content] if content is not None else None,
        }
    text, finish, entries, saw_logprobs = [], None, [], False
    for chunk in api.chat.completions.create(stream=True, **request):
        choice = chunk.choices[0]
        text.append(choice.delta.content or "")
        finish = choice.finish_reason or finish
        if choice.logprobs is not None:
            saw_logprobs = True
            entries += [e.model_dump() for e in choice.logprobs.content or []]
    return {"text": "".join(text), "finish": finish, "logprobs": entries if saw_logprobs else None}


def check_constraint(kind: str, answer: dict[str, Any]) -> None:
    text = answer["text"]
    if kind == "json_object":
        # An open grammar: a random model may not close the object within max_tokens.
        if answer["finish"] == "stop":
            assert isinstance(json.loads(text), dict), text
        else:
            assert text.lstrip().startswith("{"), text
        return
    assert answer["finish"] == "stop", answer
    if kind == "json_schema":
        assert jsonschema_rs.is_valid(SCHEMA, json.loads(text)), text
    elif kind == "regex":
        assert re.fullmatch(REGEX, text), text
    else:
        assert text in CHOICES, text


@pytest.mark.parametrize("family", MODELS)
@pytest.mark.parametrize("kind", CONSTRAINTS)
def test_constrained_answers_hold_and_pd_matches_aggregated(
    procs: dict[str, Proc], family: str, kind: str
) -> None:
    reference = ask(procs[f"{family}-agg"], family, **CONSTRAINTS[kind])
    check_constraint(kind, reference)
    for name in PD_GATEWAYS[family]:
        for stream in (False, True):
            answer = ask(procs[f"{family}-{name}"], family, stream, **CONSTRAINTS[kind])
            assert answer == reference, (name, stream)


@pytest.mark.parametrize("family", MODELS)
def test_text_only_constrained_answers(procs: dict[str, Proc], family: str) -> None:
    reference = ask(procs[f"{family}-agg"], family, image_seed=None, **CONSTRAINTS["json_schema"])
    check_constraint("json_schema", reference)
    assert ask(procs[f"{family}-pd"], family, image_seed=None, **CONSTRAINTS["json_schema"]) == (
        reference
    )


@pytest.mark.parametrize("family", MODELS)
def test_logprobs_are_the_greedy_distribution_and_survive_pd(
    procs: dict[str, Proc], family: str
) -> None:
    extra = {"logprobs": True, "top_logprobs": 4, "max_tokens": 10}
    reference = ask(procs[f"{family}-agg"], family, **extra)
    entries = reference["logprobs"]
    assert entries is not None and len(entries) == 10
    for entry in entries:
        tops = entry["top_logprobs"]
        assert len(tops) == 4 and entry["logprob"] <= 0
        values = [t["logprob"] for t in tops]
        assert values == sorted(values, reverse=True)
        # Greedy: the chosen token is the most likely one.
        assert (tops[0]["token"], tops[0]["logprob"]) == (entry["token"], entry["logprob"])
    assert all(e["bytes"] for e in entries)  # every token has its bytes
    for name in PD_GATEWAYS[family]:
        for stream in (False, True):
            answer = ask(procs[f"{family}-{name}"], family, stream, **extra)
            assert answer["text"] == reference["text"], (name, stream)
            for ours, theirs in zip(answer["logprobs"], entries, strict=True):
                assert ours["token"] == theirs["token"]
                assert ours["logprob"] == pytest.approx(theirs["logprob"], abs=1e-4)


def test_constrained_logprobs_mask_other_tokens(procs: dict[str, Proc]) -> None:
    answer = ask(
        procs["qwen-pd"],
        "qwen",
        logprobs=True,
        top_logprobs=3,
        extra_body={"guided_choice": ["yes", "no"]},
    )
    assert answer["text"] in ("yes", "no") and answer["finish"] == "stop"
    first = answer["logprobs"][0]
    # Only "y" and "n" can start an answer: the third alternative is masked (-inf → -9999).
    assert {t["token"] for t in first["top_logprobs"][:2]} == {"y", "n"}
    assert first["top_logprobs"][2]["logprob"] == -9999.0


@pytest.mark.parametrize("gateway", ["qwen-agg", "qwen-pd", "llava-lmo"])
def test_logit_bias_makes_greedy_pick_the_token(procs: dict[str, Proc], gateway: str) -> None:
    family = gateway.split("-")[0]
    token = ord("Q")  # the built-in models' ids 0..255 are the bytes themselves
    answer = ask(procs[gateway], family, max_tokens=6, logit_bias={str(token): 100})
    assert answer["text"] == "Q" * 6


def test_completions_logprobs_and_constraint(procs: dict[str, Proc]) -> None:
    for name in ("qwen-agg", "qwen-parallel"):
        reply = client(procs[name]).completions.create(
            model=MODELS["qwen"],
            prompt="The weather is",
            max_tokens=16,
            temperature=0,
            logprobs=2,
            extra_body={"guided_regex": "[a-z]{3,8}"},
        )
        choice = reply.choices[0]
        assert re.fullmatch("[a-z]{3,8}", choice.text), choice.text
        lp = choice.logprobs
        # Every generated token has an entry, the closing stop token too (text skips it).
        assert lp is not None and len(lp.tokens) == reply.usage.completion_tokens
        assert "".join(lp.tokens).startswith(choice.text) and choice.finish_reason == "stop"
        assert lp.text_offset == [sum(map(len, lp.tokens[:i])) for i in range(len(lp.tokens))]
        assert all(len(top) <= 3 for top in lp.top_logprobs)


def test_bad_constraints_are_refused_before_and_by_the_worker(procs: dict[str, Proc]) -> None:
    api = client(procs["qwen-pd"])
    with pytest.raises(openai.BadRequestError) as before:
        api.chat.completions.create(
            model=MODELS["qwen"],
            messages=messages(None),
            extra_body={"guided_regex": "(unclosed"},
        )
    assert before.value.body["code"] == "invalid_structured_output"
    assert before.value.body["param"] == "guided_regex"
    with pytest.raises(openai.BadRequestError) as by_worker:
        api.chat.completions.create(
            model=MODELS["qwen"],
            messages=messages(None),
            extra_body={"structured_outputs": {"grammar": "root ::= ("}},
        )
    assert by_worker.value.body["code"] == "invalid_structured_output"
    assert by_worker.value.body["param"] == "structured_outputs.grammar"
    # The pair still serves.
    assert ask(procs["qwen-pd"], "qwen", max_tokens=4)["finish"] == "length"
