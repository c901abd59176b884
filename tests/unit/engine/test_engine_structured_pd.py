"""A constrained, logprob-returning decode leg gives the aggregated answer after a KV import.

The gateway sends the constraint and ``logprobs`` on the decode leg only. That leg imports
the KV of all prompt tokens but the last (here: computed by the full model, as the prefill
worker computes it), computes the last one itself on a language-model-only runner, and so
draws its first generated token under the grammar too. Tokens must be identical to the
aggregated engine's and logprobs equal (1e-5: the two legs split the prompt's matmuls
differently).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tandem.engine.core import EmbeddedEngine
from tandem.engine.kv_store import KvStore
from tandem.engine.prefix_cache import PrefixCache
from tandem.engine.request import EngineOutput, EngineRequest
from tandem.engine.runner import ModelRunner
from tandem.engine.sampling import SamplingConfig
from tandem.engine.structured_spec import Constraint

SCHEMA = {
    "type": "object",
    "properties": {
        "color": {"enum": ["red", "blue"]},
        "n": {"type": "integer", "minimum": 1, "maximum": 5},
    },
    "required": ["color", "n"],
    "additionalProperties": False,
}
CASES = [
    ("tiny-qwen3-vl", ["gradient_wide"], {"temperature": 0.0}, 1),
    ("tiny-qwen3-vl", [], {"temperature": 1.0, "seed": 5}, 2),
    ("tiny-llava-1.5", ["red"], {"temperature": 1.0, "seed": 5}, 2),
    ("tiny-llava-1.5", ["checker"], {"temperature": 0.0}, 1),
]


def _engine(runner: ModelRunner) -> EmbeddedEngine:
    return EmbeddedEngine(runner, PrefixCache(runner.shape, 0), KvStore(runner.shape))


@pytest.fixture(scope="module")
def legs(
    builtin_dirs: dict[str, Path], runners: dict[str, ModelRunner]
) -> Iterator[dict[str, tuple[EmbeddedEngine, EmbeddedEngine]]]:
    """Per model: the aggregated engine and a language-model-only decode engine."""
    built = {
        name: (
            _engine(runners[name]),
            _engine(ModelRunner.load(path, language_model_only=True)),
        )
        for name, path in builtin_dirs.items()
    }
    for pair in built.values():
        for engine in pair:
            engine.start()
    yield built
    for pair in built.values():
        for engine in pair:
            engine.stop()


def _finals(engine: EmbeddedEngine, request: EngineRequest) -> list[EngineOutput]:
    async def collect() -> list[EngineOutput]:
        return [out async for out in engine.generate(request) if out.finished]

    return sorted(asyncio.run(collect()), key=lambda out: out.index)


@pytest.mark.parametrize(("name", "image_names", "sampling", "n"), CASES)
def test_constrained_decode_after_kv_import_matches_aggregated(
    legs: dict[str, tuple[EmbeddedEngine, EmbeddedEngine]],
    runners: dict[str, ModelRunner],
    make_prompt: Callable[..., Any],
    images: dict[str, Any],
    name: str,
    image_names: list[str],
    sampling: dict[str, Any],
    n: int,
) -> None:
    aggregated, decode = legs[name]
    prompt = make_prompt(name, [images[i] for i in image_names], "Answer in JSON.")
    config = SamplingConfig(max_tokens=40, logprobs=3, **sampling)
    schema = Constraint("json_schema", json.dumps(SCHEMA))

    whole = EngineRequest(
        "agg",
        prompt.ids,
        config,
        prompt.media,
        n=n,
        constraint=aggregated.compile_constraint(schema, []),
    )
    expected = _finals(aggregated, whole)

    # What the prefill worker exports: the KV of every prompt token but the last.
    _, exported = runners[name].prefill(prompt.ids[:-1], prompt.media)
    pulled = [(k.clone(), v.clone()) for k, v in exported.kv]
    leg = EngineRequest(
        "decode-leg",
        prompt.ids,
        config,
        prompt.without_pixels(),
        n=n,
        imported_kv=pulled,
        constraint=decode.compile_constraint(schema, []),
    )
    got = _finals(decode, leg)

    assert [out.output_ids for out in got] == [out.output_ids for out in expected]
    assert [out.finish_reason for out in got] == [out.finish_reason for out in expected]
    assert got[0].output_ids[0] == ord("{")  # the first token was constrained on the leg
    for mine, theirs in zip(got, expected, strict=True):
        assert len(mine.output_logprobs) == len(mine.output_ids)
        for a, b in zip(mine.output_logprobs, theirs.output_logprobs, strict=True):
            assert a.token_id == b.token_id and a.top_ids == b.top_ids
            assert a.logprob == pytest.approx(b.logprob, abs=1e-5)
            assert a.top_values == pytest.approx(b.top_values, abs=1e-5)
