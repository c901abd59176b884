"""Constrained decoding and logprobs in the embedded engine, on both built-in models.

The models were trained on pictures of shapes and a little JSON (engine/builtin_shapes.py):
under an open grammar they may never finish, so completion is tested with bounded
constraints (an enum and a small integer range, a short regex, a choice list, small
grammars) and open ones (json_object) for a valid prefix. The reference for masks and
logprobs is computed here, independently: an xgrammar compiler built in this file, bits
unpacked by hand, and ``log_softmax`` of the runner's own logits.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest
import torch
from tokenizers import Tokenizer

from tandem.engine.core import EmbeddedEngine, GrammarViolation
from tandem.engine.kv_store import KvStore
from tandem.engine.null import NullEngine, null_shape
from tandem.engine.prefix_cache import PrefixCache
from tandem.engine.refusals import RefusedField
from tandem.engine.request import EngineOutput, EngineRequest
from tandem.engine.runner import ModelRunner
from tandem.engine.sampling import SamplingConfig
from tandem.engine.structured import CompiledConstraint, TokenMatcher
from tandem.engine.structured_spec import Constraint, StructuredOutputError
from tandem.models.info import load_model_info

MODELS = ("tiny-qwen3-vl", "tiny-llava-1.5")
PROMPT = "Reply with a JSON object naming the colour."
# Bounded, and in the words the models learnt to answer JSON questions with
# (builtin_shapes.json_answer): a key they never saw leaves them to the whitespace JSON
# allows before its colon. The integer-range case runs over gRPC (test_worker_structured).
SCHEMA = {
    "type": "object",
    "properties": {
        "color": {"enum": ["red", "blue"]},
        "shape": {"enum": ["circle", "square", "triangle"]},
    },
    "required": ["color", "shape"],
    "additionalProperties": False,
}
GREEDY: dict[str, Any] = {"temperature": 0.0}
SEEDED: dict[str, Any] = {"temperature": 1.0, "seed": 11}


@pytest.fixture(scope="module")
def engines(runners: dict[str, ModelRunner]) -> Iterator[dict[str, EmbeddedEngine]]:
    built = {
        name: EmbeddedEngine(runner, PrefixCache(runner.shape, 0), KvStore(runner.shape))
        for name, runner in runners.items()
    }
    for engine in built.values():
        engine.start()
    yield built
    for engine in built.values():
        engine.stop()


@pytest.fixture(scope="module")
def reference(builtin_dirs: dict[str, Path], runners: dict[str, ModelRunner]) -> dict[str, Any]:
    """xgrammar compilers built here, as vLLM builds its own, to check the engine against."""
    import transformers
    import xgrammar as xgr

    return {
        name: xgr.GrammarCompiler(
            xgr.TokenizerInfo.from_huggingface(
                transformers.AutoTokenizer.from_pretrained(path),
                vocab_size=runners[name].shape.vocab_size,
            )
        )
        for name, path in builtin_dirs.items()
    }


# The engine's JSON grammars are compact by default (worker --json-whitespace): the reference
# grammars are built the same way.
COMPACT = False


def outputs(engine: EmbeddedEngine, request: EngineRequest) -> list[EngineOutput]:
    async def collect() -> list[EngineOutput]:
        return [out async for out in engine.generate(request)]

    return asyncio.run(collect())


def finals(engine: EmbeddedEngine, request: EngineRequest) -> list[EngineOutput]:
    done = [out for out in outputs(engine, request) if out.finished]
    assert len(done) == request.n
    return sorted(done, key=lambda out: out.index)


def constrained(
    engine: EmbeddedEngine,
    prompt: Any,
    constraint: Constraint | None,
    *,
    n: int = 1,
    stop_token_ids: tuple[int, ...] = (),
    **sampling: Any,
) -> EngineRequest:
    compiled = engine.compile_constraint(constraint, stop_token_ids) if constraint else None
    config = SamplingConfig(stop_token_ids=stop_token_ids, **sampling)
    return EngineRequest("r", prompt.ids, config, prompt.media, n=n, constraint=compiled)


@functools.cache
def tokenizer(model_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(model_dir / "tokenizer.json"))


def text(out: EngineOutput, engine: EmbeddedEngine) -> str:
    """The answer without its final stop token, as the grammar reads it.

    Added tokens decode to their text: xgrammar reads the built-in tokenizers' added tokens
    as text (LLaVA's ``<s>`` is "<s>", in vLLM too, which builds its matchers alike), so a
    grammar may take them.
    """
    ids = out.output_ids
    if ids[-1] in stops_of(engine):
        ids = ids[:-1]
    return tokenizer(engine.runner.info.model_dir).decode(ids, skip_special_tokens=False)


def stops_of(engine: EmbeddedEngine) -> set[int]:
    return set(engine.runner.eos_token_ids)


def allowed(matcher: Any, vocab: int) -> torch.Tensor:
    """The grammar's allowed tokens as a bool [vocab] tensor, bits unpacked by hand."""
    import xgrammar as xgr

    bitmask = xgr.allocate_token_bitmask(1, vocab)
    matcher.fill_next_token_bitmask(bitmask)
    words = bitmask[0].tolist()
    return torch.tensor([bool((words[i // 32] >> (i % 32)) & 1) for i in range(vocab)])


def replay(
    runner: ModelRunner, prompt: Any, tokens: list[int], grammar: Any, stops: list[int]
) -> list[torch.Tensor]:
    """log_softmax of the runner's logits at each generated position, masked by ``grammar``."""
    import xgrammar as xgr

    matcher = xgr.GrammarMatcher(grammar, override_stop_tokens=stops) if grammar else None
    logits, state = runner.prefill(prompt.ids, prompt.media)
    expected = []
    for token in tokens:
        scores = logits.detach().float().clone()
        if matcher is not None:
            scores[~allowed(matcher, runner.shape.vocab_size)] = -math.inf
            assert matcher.accept_token(token)
        expected.append(torch.log_softmax(scores, dim=0))
        logits = runner.decode_step(state, token)
    return expected


def check_logprobs(out: EngineOutput, expected: list[torch.Tensor], k: int, greedy: bool) -> None:
    assert [e.token_id for e in out.output_logprobs] == out.output_ids
    assert len(expected) == len(out.output_ids)
    for entry, reference in zip(out.output_logprobs, expected, strict=True):
        assert entry.logprob <= 0.0
        assert entry.logprob == pytest.approx(float(reference[entry.token_id]), abs=1e-5)
        assert len(entry.top_ids) == len(entry.top_values) == k
        assert list(entry.top_values) == sorted(entry.top_values, reverse=True)
        for tid, value in zip(entry.top_ids, entry.top_values, strict=True):
            assert value == pytest.approx(float(reference[tid]), abs=1e-5)
        if k:
            best = float(reference.max())
            assert entry.top_values[0] == pytest.approx(best, abs=1e-5)
            if greedy:
                assert entry.token_id == entry.top_ids[0]
                assert entry.logprob == entry.top_values[0]


SCHEMA_CASES = [
    ("tiny-qwen3-vl", [], GREEDY, 1),
    ("tiny-qwen3-vl", ["red"], SEEDED, 2),
    ("tiny-llava-1.5", [], SEEDED, 2),
    ("tiny-llava-1.5", ["gradient"], GREEDY, 1),
]


@pytest.mark.parametrize(("name", "image_names", "sampling", "n"), SCHEMA_CASES)
def test_bounded_schema_answers_validate(
    engines: dict[str, EmbeddedEngine],
    make_prompt: Callable[..., Any],
    images: dict[str, Any],
    name: str,
    image_names: list[str],
    sampling: dict[str, Any],
    n: int,
) -> None:
    engine = engines[name]
    prompt = make_prompt(name, [images[i] for i in image_names], PROMPT)
    schema = Constraint("json_schema", json.dumps(SCHEMA))
    request = constrained(engine, prompt, schema, n=n, max_tokens=200, **sampling)
    validator = jsonschema_rs.validator_for(SCHEMA)
    for out in finals(engine, request):
        assert out.finish_reason == "stop", text(out, engine)[:80]
        assert out.output_ids[-1] in stops_of(engine)  # the stop token ends the answer
        answer = json.loads(text(out, engine))
        assert validator.is_valid(answer), answer


PATTERN = r"(yes|no)-[0-9]{1,3}"
CHOICES = ("red", 'say "hi"', "tab\there")
GRAMMARS = {
    "ebnf": ('root ::= "(" [0-9] [0-9]? ")"', r"\([0-9]{1,2}\)"),
    "lark": ('start: "<" WORD ">"\nWORD: /[a-z]{1,4}/', r"<[a-z]{1,4}>"),
}


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_regex_choice_and_grammar_answers_match(
    engines: dict[str, EmbeddedEngine],
    make_prompt: Callable[..., Any],
    name: str,
    sampling: dict[str, Any],
) -> None:
    engine = engines[name]
    prompt = make_prompt(name, [], "Answer briefly.")
    stops = stops_of(engine)
    cases: list[tuple[Constraint, Callable[[str], bool]]] = [
        (Constraint("regex", PATTERN), lambda s: re.fullmatch(PATTERN, s) is not None),
        (Constraint("choice", choices=CHOICES), lambda s: s in CHOICES),
    ]
    for grammar, shape in GRAMMARS.values():
        cases.append((Constraint("grammar", grammar), lambda s, p=shape: re.fullmatch(p, s)))
    for constraint, matches in cases:
        request = constrained(engine, prompt, constraint, n=2, max_tokens=16, **sampling)
        for out in finals(engine, request):
            assert out.finish_reason == "stop", (constraint, out.output_ids)
            assert out.output_ids[-1] in stops
            assert matches(text(out, engine)), (constraint, text(out, engine))


@pytest.mark.parametrize("name", MODELS)
def test_open_json_object_output_is_a_valid_prefix(
    engines: dict[str, EmbeddedEngine],
    reference: dict[str, Any],
    make_prompt: Callable[..., Any],
    images: dict[str, Any],
    name: str,
) -> None:
    import xgrammar as xgr

    engine = engines[name]
    prompt = make_prompt(name, [images["checker"]], "Describe the image as JSON.")
    grammar = reference[name].compile_json_schema('{"type": "object"}', any_whitespace=COMPACT)
    stops = sorted(stops_of(engine))
    for sampling in (GREEDY, SEEDED):
        request = constrained(
            engine, prompt, Constraint("json_object"), n=2, max_tokens=40, **sampling
        )
        for out in finals(engine, request):
            fresh = xgr.GrammarMatcher(grammar, override_stop_tokens=stops)
            assert all(fresh.accept_token(t) for t in out.output_ids), out.output_ids
            assert out.output_ids[0] == ord("{")
            if out.finish_reason == "stop":
                assert isinstance(json.loads(text(out, engine)), dict)
            else:
                assert out.finish_reason == "length"


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("kind", ["free", "schema"])
def test_logprobs_equal_log_softmax_of_the_runner_logits(
    engines: dict[str, EmbeddedEngine],
    runners: dict[str, ModelRunner],
    reference: dict[str, Any],
    make_prompt: Callable[..., Any],
    images: dict[str, Any],
    name: str,
    kind: str,
) -> None:
    engine, runner = engines[name], runners[name]
    prompt = make_prompt(name, [images["red"]] if kind == "free" else [], PROMPT)
    stops = sorted(stops_of(engine))
    constraint, grammar = None, None
    if kind == "schema":
        constraint = Constraint("json_schema", json.dumps(SCHEMA))
        grammar = reference[name].compile_json_schema(json.dumps(SCHEMA), any_whitespace=COMPACT)
    for sampling, n, k in ((GREEDY, 1, 3), (SEEDED, 2, 2), (GREEDY, 1, 0)):
        request = constrained(
            engine,
            prompt,
            constraint,
            n=n,
            max_tokens=24,
            ignore_eos=kind == "free",
            logprobs=k,
            **sampling,
        )
        for out in finals(engine, request):
            expected = replay(runner, prompt, out.output_ids, grammar, stops)
            check_logprobs(out, expected, k, greedy=sampling is GREEDY)


def test_streamed_deltas_carry_their_own_entries(
    engines: dict[str, EmbeddedEngine], make_prompt: Callable[..., Any]
) -> None:
    engine = engines["tiny-llava-1.5"]
    prompt = make_prompt("tiny-llava-1.5", [], PROMPT)
    request = constrained(engine, prompt, None, max_tokens=5, ignore_eos=True, logprobs=1)
    outs = outputs(engine, request)
    assert [len(out.logprobs) for out in outs] == [1] * 5
    assert [out.logprobs[0].token_id for out in outs] == [out.token_ids[0] for out in outs]
    assert [out.output_logprobs for out in outs[:-1]] == [[]] * 4
    assert outs[-1].output_logprobs == [out.logprobs[0] for out in outs]
    # Not asked: nothing computed, nothing carried.
    plain = outputs(engine, constrained(engine, prompt, None, max_tokens=3, ignore_eos=True))
    assert all(not out.logprobs and not out.output_logprobs for out in plain)


@pytest.mark.parametrize("name", MODELS)
def test_constrained_logprobs_mask_disallowed_tokens(
    engines: dict[str, EmbeddedEngine], make_prompt: Callable[..., Any], name: str
) -> None:
    engine = engines[name]
    prompt = make_prompt(name, [], "Yes or no?")
    choice = Constraint("choice", choices=("yes", "no"))
    (out,) = finals(engine, constrained(engine, prompt, choice, max_tokens=8, logprobs=5))
    first = out.output_logprobs[0]
    finite = [t for t, v in zip(first.top_ids, first.top_values, strict=True) if v > -math.inf]
    assert sorted(finite) == [ord("n"), ord("y")]
    assert first.top_values[2:] == (-math.inf,) * 3
    assert math.fsum(math.exp(v) for v in first.top_values) == pytest.approx(1.0, abs=1e-5)
    # After the first letter only one spelling is left: the next token is certain.
    assert out.output_logprobs[1].logprob == 0.0
    assert out.output_logprobs[1].top_values[1:] == (-math.inf,) * 4


@pytest.mark.parametrize("name", MODELS)
def test_logit_bias_plus_100_makes_greedy_pick_the_token(
    engines: dict[str, EmbeddedEngine], make_prompt: Callable[..., Any], name: str
) -> None:
    engine = engines[name]
    prompt = make_prompt(name, [], "Say something.")
    z = ord("Z")
    (free,) = finals(
        engine,
        constrained(
            engine,
            prompt,
            None,
            max_tokens=3,
            ignore_eos=True,
            logprobs=1,
            **GREEDY,
            logit_bias=((z, 100.0),),
        ),
    )
    assert free.output_ids == [z, z, z]
    # The logprob is the model's own, not the biased one.
    assert free.output_logprobs[0].logprob < 0.0
    assert free.output_logprobs[0].top_ids != (z,)
    # A constraint's mask wins over any bias: Z cannot start "yes" or "no".
    choice = Constraint("choice", choices=("yes", "no"))
    (masked,) = finals(
        engine,
        constrained(engine, prompt, choice, max_tokens=8, logit_bias=((z, 100.0),), **GREEDY),
    )
    assert text(masked, engine) in ("yes", "no")


def test_request_stop_token_ids_end_the_grammar_too(
    engines: dict[str, EmbeddedEngine], make_prompt: Callable[..., Any]
) -> None:
    engine = engines["tiny-qwen3-vl"]
    prompt = make_prompt("tiny-qwen3-vl", [], "Go.")
    bang = ord("!")
    choice = Constraint("choice", choices=("ab",))
    bias = ((bang, 100.0),)
    (own,) = finals(
        engine,
        constrained(
            engine,
            prompt,
            choice,
            stop_token_ids=(bang,),
            max_tokens=8,
            logit_bias=bias,
            **GREEDY,
        ),
    )
    assert (own.output_ids, own.finish_reason) == ([ord("a"), ord("b"), bang], "stop")
    # Without it, "!" is no stop token: the grammar forbids it and an eos ends the answer.
    (eos,) = finals(
        engine, constrained(engine, prompt, choice, max_tokens=8, logit_bias=bias, **GREEDY)
    )
    assert eos.output_ids[:2] == [ord("a"), ord("b")]
    assert eos.output_ids[2] in stops_of(engine) and eos.finish_reason == "stop"


@pytest.mark.parametrize("extra", [{"ignore_eos": True}, {"min_tokens": 6}])
def test_a_complete_grammar_ends_the_sample_whatever_eos_settings_say(
    engines: dict[str, EmbeddedEngine], make_prompt: Callable[..., Any], extra: dict[str, Any]
) -> None:
    # Neither an ignored eos nor min_tokens can extend an answer the grammar has closed:
    # after "yes" or "no" only a stop token is allowed, and it ends the sample.
    engine = engines["tiny-llava-1.5"]
    prompt = make_prompt("tiny-llava-1.5", [], "Yes or no?")
    choice = Constraint("choice", choices=("yes", "no"))
    (out,) = finals(engine, constrained(engine, prompt, choice, max_tokens=8, **extra, **GREEDY))
    assert out.finish_reason == "stop"
    assert out.output_ids[-1] in stops_of(engine)
    assert text(out, engine) in ("yes", "no")


class RefusingMatcher(TokenMatcher):
    """A matcher that refuses every token: no real grammar refuses a token chosen under its
    own mask, so this stand-in is the only way to reach the engine's error path."""

    def accept(self, token: int) -> bool:
        return False


class RefusingConstraint(CompiledConstraint):
    def matcher(self) -> TokenMatcher:
        return RefusingMatcher(self)


def test_a_refused_token_ends_its_request_not_the_engine(
    engines: dict[str, EmbeddedEngine], make_prompt: Callable[..., Any]
) -> None:
    engine = engines["tiny-llava-1.5"]
    prompt = make_prompt("tiny-llava-1.5", [], "Hi")
    real = engine.compile_constraint(Constraint("regex", "[a-z]+"), [])
    broken = RefusingConstraint(real.kind, real.grammar, real.stop_token_ids, real.vocab_size)
    request = EngineRequest("bad", prompt.ids, SamplingConfig(max_tokens=4), constraint=broken)
    with pytest.raises(GrammarViolation, match="refused token"):
        outputs(engine, request)
    assert engine.alive
    after = constrained(engine, prompt, Constraint("regex", "[a-z]{2}"), max_tokens=4)
    (out,) = finals(engine, after)
    assert re.fullmatch("[a-z]{2}", text(out, engine))


def test_without_xgrammar_only_constrained_requests_are_refused(
    engines: dict[str, EmbeddedEngine],
    make_prompt: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = engines["tiny-qwen3-vl"]
    monkeypatch.setitem(sys.modules, "xgrammar", None)  # makes `import xgrammar` fail
    with pytest.raises(StructuredOutputError) as info:
        engine.compile_constraint(Constraint("json_object"), [])
    assert info.value.code == "unsupported_parameter"
    assert "need xgrammar" in str(info.value) and "tandem[structured]" in str(info.value)
    prompt = make_prompt("tiny-qwen3-vl", [], "Hi")
    plain = constrained(engine, prompt, None, max_tokens=2, ignore_eos=True, logprobs=2)
    (out,) = finals(engine, plain)
    assert len(out.output_ids) == len(out.output_logprobs) == 2


def test_the_null_engine_refuses_what_it_cannot_honour(builtin_dirs: dict[str, Path]) -> None:
    info = load_model_info(builtin_dirs["tiny-qwen3-vl"])
    engine = NullEngine(info, KvStore(null_shape(info)))
    engine.start()
    assert engine.returns_logprobs is False
    with pytest.raises(StructuredOutputError, match="null engine") as refused:
        engine.compile_constraint(Constraint("regex", "a+"), [])
    assert refused.value.code == "unsupported_parameter"
    request = EngineRequest("n", [1, 2, 3], SamplingConfig(max_tokens=2, logprobs=0))

    async def first() -> None:
        async for _ in engine.generate(request):
            pass

    with pytest.raises(RefusedField, match="no logprobs"):
        asyncio.run(first())
