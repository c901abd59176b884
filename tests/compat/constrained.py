"""Constrained and logprob requests for the vLLM lane, and how two engines' answers compare.

The same requests go through a Tandem gateway in front of a vLLM CPU worker and in front of
Tandem's embedded worker (``test_vllm_workers``). Both engines use xgrammar with the same
compile settings (docs/pd-contract.md §20; vLLM pinned to it in ``vllm_procs``), so greedy
answers must be identical and logprobs — the raw log-softmax after the grammar mask,
before logit bias — equal up to float32 noise.

The built-in models know only pictures of shapes (and a little JSON): the schemas and
grammars here are bounded so that greedy decoding finishes; ``json_object`` and a schema
without the whitespace bias are open
(xgrammar's JSON grammars allow any whitespace, as vLLM's do) and are compared on their
text and finish reason whatever they are.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import jsonschema_rs
import openai

from tandem.wire.proto import GenerateRequest

from .vllm_stages import messages

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
# EBNF (GBNF), bounded: "(a)" up to "(a,b,c)".
GRAMMAR = 'root ::= "(" item ("," item)? ("," item)? ")"\nitem ::= [a-e]'
MAX_TOKENS = 40
# Tab, newline, carriage return, space: the built-in models' ids 0..255 are the bytes. Both
# engines apply logit_bias after the grammar mask; without it a random-weight model may
# pick whitespace inside a JSON object until max_tokens.
WHITESPACE = tuple(b"\t\n\r ")
NO_WHITESPACE = {str(b): -100 for b in WHITESPACE}
FORMAT = {"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA, "strict": True}}
# Request fields (openai client keyword arguments) of each constrained case.
CONSTRAINTS: dict[str, dict[str, Any]] = {
    "json_schema": {"response_format": FORMAT, "logit_bias": NO_WHITESPACE},
    "json_schema_any_whitespace": {"response_format": FORMAT},
    "json_object": {"response_format": {"type": "json_object"}},
    "regex": {"extra_body": {"structured_outputs": {"regex": REGEX}}},
    "choice": {"extra_body": {"structured_outputs": {"choice": CHOICES}}},
    "grammar": {"extra_body": {"structured_outputs": {"grammar": GRAMMAR}}},
}
BOUNDED = ("json_schema", "regex", "choice", "grammar")
TOLERANCE = 1e-3  # logprobs of the two engines (the acceptance figure)
TIE = 1e-6  # alternatives this close may be cut or ordered differently by either engine
FLOOR = -9999.0  # how the gateway renders a masked (-inf) alternative


def wire_constraint(req: GenerateRequest, kind: str) -> GenerateRequest:
    """Put case ``kind``'s constraint (and bias) on a wire request, as the gateway would."""
    params = req.sampling_params
    if kind.startswith("json_schema"):
        params.json_schema = json.dumps(SCHEMA, separators=(",", ":"))
        if kind == "json_schema":
            for token in WHITESPACE:
                params.logit_bias[token] = -100.0
    elif kind == "json_object":
        params.json_object = True
    elif kind == "regex":
        params.regex = REGEX
    elif kind == "choice":
        params.choice.choices.extend(CHOICES)
    elif kind == "grammar":
        params.grammar = GRAMMAR
    else:
        raise ValueError(kind)
    return req


# An alternative: its key (chat: token text and bytes; completions: token text) and value.
Alternative = tuple[Any, float]


@dataclass(frozen=True)
class Entry:
    """One output token's logprob entry, engine-neutral."""

    key: Any
    logprob: float
    top: tuple[Alternative, ...]


@dataclass(frozen=True)
class Answer:
    text: str
    finish: str | None
    completion_tokens: int
    logprobs: tuple[Entry, ...] | None = None

    def outcome(self) -> dict[str, Any]:
        """What must be identical between engines (logprob values compared apart)."""
        return {"text": self.text, "finish": self.finish, "tokens": self.completion_tokens}

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def chat(client: openai.OpenAI, model: str, text: str, image: str | None, **fields: Any) -> Answer:
    """One greedy chat answer (``fields``: extra request fields)."""
    fields.setdefault("max_tokens", MAX_TOKENS)
    reply = client.chat.completions.create(
        model=model, messages=messages(text, image), temperature=0, **fields
    )
    choice = reply.choices[0]
    entries = None
    if choice.logprobs is not None and choice.logprobs.content is not None:
        entries = tuple(
            Entry(
                (e.token, tuple(e.bytes or ())),
                e.logprob,
                tuple(((t.token, tuple(t.bytes or ())), t.logprob) for t in e.top_logprobs),
            )
            for e in choice.logprobs.content
        )
    usage = reply.usage.completion_tokens if reply.usage else -1
    return Answer(choice.message.content or "", choice.finish_reason, usage, entries)


def completion(client: openai.OpenAI, model: str, prompt: str, **fields: Any) -> Answer:
    """One greedy legacy-completions answer."""
    fields.setdefault("max_tokens", MAX_TOKENS)
    reply = client.completions.create(model=model, prompt=prompt, temperature=0, **fields)
    choice = reply.choices[0]
    entries = None
    lp = choice.logprobs
    if lp is not None and lp.tokens is not None:
        tops = lp.top_logprobs or [None] * len(lp.tokens)
        entries = tuple(
            Entry(token, value, tuple((top or {}).items()))
            for token, value, top in zip(lp.tokens, lp.token_logprobs or [], tops, strict=True)
        )
    usage = reply.usage.completion_tokens if reply.usage else -1
    return Answer(choice.text, choice.finish_reason, usage, entries)


@dataclass(frozen=True)
class Case:
    """One request for both engines: how to ask it, and which constraint its answer obeys."""

    ask: Callable[[openai.OpenAI], Answer]
    constraint: str | None = None
    keys_unique: bool = True  # chat alternatives carry bytes; completions' only text

    def check(self, answer: Answer) -> None:
        if self.constraint is not None:
            check_constraint(self.constraint, answer)


def structured_cases(model: str, texts: Sequence[str], images: Sequence[str]) -> dict[str, Case]:
    """Each constraint on a text and an image request, then logprobs, constrained or not:
    chat with ``top_logprobs=5``, completions with ``logprobs=3``."""
    cases = {}
    for kind, fields in CONSTRAINTS.items():
        for label, image in (("text", None), ("image", images[0])):
            ask = partial(chat, model=model, text=texts[0], image=image, **fields)
            cases[f"{kind}/{label}"] = Case(ask, kind)
    top = {"logprobs": True, "top_logprobs": 5}
    for label, image in (("text", None), ("image", images[1])):
        ask = partial(chat, model=model, text=texts[1], image=image, max_tokens=12, **top)
        cases[f"logprobs/{label}"] = Case(ask)
    for kind in BOUNDED:
        ask = partial(chat, model=model, text=texts[1], image=None, **top, **CONSTRAINTS[kind])
        cases[f"logprobs/{kind}"] = Case(ask, kind)
    prompt = "The weather today is"
    plain = partial(completion, model=model, prompt=prompt, max_tokens=12, logprobs=3)
    cases["completions-logprobs/plain"] = Case(plain, keys_unique=False)
    regex = partial(completion, model=model, prompt=prompt, logprobs=3, **CONSTRAINTS["regex"])
    cases["completions-logprobs/regex"] = Case(regex, "regex", keys_unique=False)
    return cases


def check_constraint(kind: str, answer: Answer) -> None:
    """The answer satisfies its constraint; bounded constraints finish with ``stop``."""
    text = answer.text
    if kind in BOUNDED:
        assert answer.finish == "stop", (kind, answer)
    if kind.startswith("json_"):
        if answer.finish == "stop":
            value = json.loads(text)
            assert isinstance(value, dict), text
            if kind.startswith("json_schema"):
                assert jsonschema_rs.is_valid(SCHEMA, value), text
        else:  # an open grammar cut at max_tokens: a valid start at least
            assert text.lstrip(" \t\n\r").startswith("{"), text
    elif kind == "regex":
        assert re.fullmatch(REGEX, text), text
    elif kind == "choice":
        assert text in CHOICES, text
    elif kind == "grammar":
        assert re.fullmatch(r"\([a-e](,[a-e]){0,2}\)", text), text


def logprob_gap(ours: Answer, theirs: Answer, *, keys_unique: bool = True) -> float:
    """The largest logprob difference between two answers' entries, alternatives included.

    Asserts what must be identical: the tokens, and which alternatives each lists, with
    two allowances, both for vLLM's side (``theirs``): its servicer lists the sampled
    token first whatever its rank (Tandem lists the true top k; under logit_bias greedy may
    pick a token outside the raw top k), and alternatives tied within ``TIE`` at the cut
    of the list may differ. Masked alternatives (rendered ``FLOOR``) are counted, never
    matched by token: with all of them at -inf each engine names arbitrary ones. Without
    ``keys_unique`` (completions, whose alternatives are keyed by text, so two masked
    tokens that both read U+FFFD collapse into one) they are not counted either.
    """
    assert ours.logprobs is not None and theirs.logprobs is not None
    assert len(ours.logprobs) == len(theirs.logprobs)
    gap = 0.0
    for i, (a, b) in enumerate(zip(ours.logprobs, theirs.logprobs, strict=True)):
        assert a.key == b.key, (i, a.key, b.key)
        if keys_unique:
            assert len(a.top) == len(b.top), (i, a.top, b.top)
        gap = max(gap, abs(a.logprob - b.logprob), _alternatives_gap(i, a, b))
    return gap


def _alternatives_gap(i: int, ours: Entry, theirs: Entry) -> float:
    mine = {k: v for k, v in ours.top if v != FLOOR}
    other = {k: v for k, v in theirs.top if v != FLOOR}
    assert len(mine) == len(other), (i, "masked alternatives", ours.top, theirs.top)
    for value in (*mine.values(), *other.values()):
        assert math.isfinite(value) and value <= 0.0, (i, value)
    shared = mine.keys() & other.keys()
    gap = max((abs(mine[k] - other[k]) for k in shared), default=0.0)
    only_mine, only_other = mine.keys() - shared, other.keys() - shared
    only_other.discard(ours.key)  # vLLM's sampled-first entry (see logprob_gap)
    for only, values in ((only_mine, mine), (only_other, other)):
        cut = min(values.values(), default=0.0)
        off_cut = {k: values[k] for k in only if values[k] > cut + TIE}
        assert not off_cut, (i, "different alternatives", ours.top, theirs.top)
    return gap
