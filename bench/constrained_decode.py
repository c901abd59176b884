"""Constrained vs unconstrained decode cost per token on the embedded engine, both built-in models.

Usage: .venv/bin/python -m bench.constrained_decode [--threads 1] [--rounds 6]

Per model, one engine serves, round after round and interleaved (so that the machine's
noise hits every column alike), three seeded sampled requests (temperature 1, one seed
per round and prompt, shared by the three): unconstrained with ``ignore_eos`` for a fixed
length, the same with ``logprobs=5``, and one under a bounded JSON schema (an enum, an
integer in 1..5, required, no other properties; xgrammar, ``any_whitespace=True``, as
vLLM compiles it) that ends when the answer is complete. A column is the median gap
between consecutive tokens as the caller receives them (ms/token, the prefill's first
token excluded). "finished" counts the schema answers complete within the token limit
(random weights: some circle in whitespace, which ``any_whitespace`` allows). The compile
column times the schema's first compilation (tokenizer and compiler set-up included) and
a repeat served from the compiler's cache. Prints a Markdown table (a figure for docs,
not a test).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import torch
from tokenizers import Tokenizer

from tandem.engine.builtin import resolve_model
from tandem.engine.core import EmbeddedEngine
from tandem.engine.kv_store import KvStore
from tandem.engine.prefix_cache import PrefixCache
from tandem.engine.request import EngineRequest
from tandem.engine.runner import ModelRunner
from tandem.engine.sampling import SamplingConfig
from tandem.engine.structured import CompiledConstraint
from tandem.engine.structured_spec import Constraint
from tandem.models.chat import render_chat

MODELS = ("tiny-qwen3-vl", "tiny-llava-1.5")
SCHEMA = {
    "type": "object",
    "properties": {
        "color": {"enum": ["red", "blue"]},
        "n": {"type": "integer", "minimum": 1, "maximum": 5},
    },
    "required": ["color", "n"],
    "additionalProperties": False,
}
PROMPTS = ("Reply with a JSON object naming the colour.", "Give JSON", "JSON:")
MAX_TOKENS = 200
FREE_TOKENS = 64


async def _gaps(
    engine: EmbeddedEngine, request: EngineRequest
) -> tuple[list[float], int, str | None]:
    """Seconds between consecutive tokens as received, the tokens, the finish reason."""
    gaps: list[float] = []
    last: float | None = None
    tokens = 0
    reason = None
    async for out in engine.generate(request):
        now = time.perf_counter()
        reason = out.finish_reason or reason
        if out.token_ids:
            tokens += len(out.token_ids)
            if last is not None:
                gaps.append(now - last)
            last = now
    return gaps, tokens, reason


def _request(
    ids: list[int], config: SamplingConfig, constraint: CompiledConstraint | None = None
) -> EngineRequest:
    return EngineRequest("bench", ids, config, constraint=constraint)


def measure(name: str, rounds: int) -> dict[str, float]:
    model_dir = resolve_model(name)
    runner = ModelRunner.load(model_dir, model_id=name)
    # No prefix cache: every request computes its prompt alike, whatever ran before.
    engine = EmbeddedEngine(runner, PrefixCache(runner.shape, 0), KvStore(runner.shape))
    engine.start()
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    prompts = [
        tokenizer.encode(
            render_chat(model_dir, [{"role": "user", "content": text}]), add_special_tokens=False
        ).ids
        for text in PROMPTS
    ]
    schema = Constraint("json_schema", json.dumps(SCHEMA))
    start = time.perf_counter()
    compiled = engine.compile_constraint(schema, [])
    first_compile = time.perf_counter() - start
    start = time.perf_counter()
    engine.compile_constraint(schema, [])
    cached_compile = time.perf_counter() - start

    columns: dict[str, list[float]] = {"free": [], "logprobs": [], "schema": []}
    schema_tokens: list[int] = []
    finished = 0
    try:
        warm = SamplingConfig(max_tokens=8, ignore_eos=True)
        asyncio.run(_gaps(engine, _request(prompts[0], warm)))
        for round_ in range(rounds):
            for k, ids in enumerate(prompts):
                seed = 100 * round_ + k
                free = SamplingConfig(max_tokens=FREE_TOKENS, ignore_eos=True, seed=seed)
                logprobs = SamplingConfig(
                    max_tokens=FREE_TOKENS, ignore_eos=True, seed=seed, logprobs=5
                )
                bounded = SamplingConfig(max_tokens=MAX_TOKENS, seed=seed)
                columns["free"] += asyncio.run(_gaps(engine, _request(ids, free)))[0]
                columns["logprobs"] += asyncio.run(_gaps(engine, _request(ids, logprobs)))[0]
                gaps, tokens, reason = asyncio.run(_gaps(engine, _request(ids, bounded, compiled)))
                columns["schema"] += gaps
                schema_tokens.append(tokens)
                finished += reason == "stop"
    finally:
        engine.stop()
    result = {key: statistics.median(values) * 1e3 for key, values in columns.items()}
    result["schema_tokens"] = statistics.median(schema_tokens)
    result["finished"] = finished
    result["answers"] = len(schema_tokens)
    result["first_compile"] = first_compile * 1e3
    result["cached_compile"] = cached_compile * 1e3
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), {args.rounds} rounds")
    print(
        "| model | unconstrained p50 | + logprobs=5 p50 | JSON schema p50 | schema overhead "
        "| schema answers finished | answer tokens p50 | schema compile, first / cached |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name in MODELS:
        r = measure(name, args.rounds)
        overhead = (r["schema"] / r["free"] - 1.0) * 100.0
        print(
            f"| {name} | {r['free']:.2f} ms/token | {r['logprobs']:.2f} ms/token "
            f"| {r['schema']:.2f} ms/token | {overhead:+.0f}% "
            f"| {r['finished']:.0f}/{r['answers']:.0f} | {r['schema_tokens']:.0f} "
            f"| {r['first_compile']:.0f} ms / {r['cached_compile']:.2f} ms |"
        )


if __name__ == "__main__":
    main()
