"""The prompt token cache on a growing chat: CPU to tokenize each turn, with and without it.

    .venv/bin/python -m bench.prompt_token_cache [--turns 12] [--chars 600] [--system 4000]

A conversation of ``--turns`` turns (a ``--system``-character system prompt, then user and
assistant messages of about ``--chars`` characters each, every one distinct) is rendered
with the built-in Qwen3-VL chat template, as a client re-sends it at every turn, and each
turn's prompt is tokenized by the gateway's path (``ModelHandle.encode``) with the cache on
and off. The ids are compared (they must be equal) and the CPU per turn printed.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from bench.scenarios import text
from tandem.engine.builtin import generate_builtin
from tandem.gateway.model import ModelHandle
from tandem.gateway.prompt_tokens import PromptTokenCache


def conversation(turns: int, chars: int, system: int) -> list[list[dict[str, str]]]:
    """The messages each turn sends: everything so far plus the new user message."""
    messages = [{"role": "system", "content": f"rules v{turns} " + text(system)}]
    sent = []
    for turn in range(turns):
        messages.append({"role": "user", "content": f"question {turn}: " + text(chars)})
        sent.append(list(messages))
        messages.append({"role": "assistant", "content": f"answer {turn}: " + text(chars)})
    return sent


def per_turn_cpu(model: ModelHandle, prompts: list[str], rounds: int) -> list[float]:
    """The mean CPU of each turn over ``rounds`` conversations, each on an empty cache."""
    totals = [0.0] * len(prompts)
    for _ in range(rounds):
        model.prompt_tokens = PromptTokenCache(model.tokenizer, model.prompt_cache_tokens)
        for i, prompt in enumerate(prompts):
            start = time.process_time()
            model.encode(prompt)
            totals[i] += time.process_time() - start
    return [t / rounds for t in totals]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--turns", type=int, default=12)
    p.add_argument("--chars", type=int, default=600)
    p.add_argument("--system", type=int, default=4000)
    p.add_argument("--rounds", type=int, default=50)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = generate_builtin("tiny-qwen3-vl", Path(tmp), weights=False)
        cached = ModelHandle.from_dir(model_dir, "tiny-qwen3-vl")
        whole = ModelHandle.from_dir(model_dir, "tiny-qwen3-vl", prompt_cache_tokens=0)
    assert cached.prompt_tokens.enabled and not whole.prompt_tokens.enabled
    prompts = [
        cached.template.render(messages, True)
        for messages in conversation(args.turns, args.chars, args.system)
    ]
    for prompt in prompts:
        if cached.encode(prompt) != whole.encode(prompt):
            raise SystemExit("the cache's ids differ from a whole encode")
    on = per_turn_cpu(cached, prompts, args.rounds)
    off = per_turn_cpu(whole, prompts, args.rounds)
    print("turn  prompt chars  whole (us)  cached (us)")
    for i, prompt in enumerate(prompts):
        print(f"{i + 1:4d}  {len(prompt):12d}  {off[i] * 1e6:10.0f}  {on[i] * 1e6:11.0f}")
    print(f"all turns: whole {sum(off) * 1e3:.2f} ms, cached {sum(on) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
