"""The multi-turn image chat of the bench (docs/benchmarks.md, "multi-turn image chat").

Each conversation has ``turns`` user turns; every turn adds 1 or 2 images of its own and the
request carries the whole history, so turn 2 re-sends turn 1's images byte for byte and turn
3 re-sends both earlier turns' images, with the assistant's real answers in between. Images
are distinct per conversation (a few photo-like base JPEGs, each copy made byte-distinct by
``bench.fresh``), so only a cache that keeps earlier turns' images can skip work.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

from bench.fresh import prefix_b64, unique_tag


@dataclass
class Conversation:
    index: int
    new_per_turn: list[int]  # images each turn adds (1 or 2)
    replies: list[str] = field(default_factory=list)

    @property
    def turns(self) -> int:
        return len(self.new_per_turn)

    def image_ids(self, turn: int) -> list[int]:
        """The images turn ``turn`` (0-based) adds, numbered within the conversation."""
        first = sum(self.new_per_turn[:turn])
        return list(range(first, first + self.new_per_turn[turn]))


def plan(index: int, turns: int, seed: int) -> Conversation:
    rng = random.Random(seed * 1_000_003 + index)
    return Conversation(index, [rng.choice((1, 2)) for _ in range(turns)])


def image_url(rests: list[str], nonce: bytes, conv: int, image: int) -> str:
    """The data URL of image ``image`` of conversation ``conv``: same bytes on every turn."""
    base = rests[(conv * 7 + image) % len(rests)]
    tag = unique_tag(nonce, conv, image)
    return "data:image/jpeg;base64," + prefix_b64(tag).decode() + base


def messages(conv: Conversation, turn: int, rests: list[str], nonce: bytes, prompt: str):
    """The chat history sent on ``turn``: every earlier turn with its answer, then this one."""
    out: list[dict] = []
    for t in range(turn + 1):
        parts: list[dict] = [
            {"type": "image_url", "image_url": {"url": image_url(rests, nonce, conv.index, i)}}
            for i in conv.image_ids(t)
        ]
        parts.append({"type": "text", "text": f"Turn {t + 1}: {prompt}"})
        out.append({"role": "user", "content": parts})
        if t < turn:
            out.append({"role": "assistant", "content": conv.replies[t]})
    return out


def body(conv: Conversation, turn: int, rests: list[str], nonce: bytes, spec: dict) -> bytes:
    """The request body of ``turn``; ``conv.replies`` must hold the earlier answers."""
    if len(conv.replies) < turn:
        raise ValueError(f"turn {turn} needs {turn} earlier answers, have {len(conv.replies)}")
    return json.dumps(
        {
            "model": spec["model"],
            "messages": messages(conv, turn, rests, nonce, spec.get("prompt", "describe")),
            "max_tokens": spec.get("max_tokens", 16),
            "temperature": 0,
        }
    ).encode()


def reply_text(answer: bytes) -> str:
    """The assistant's text from a non-streaming chat completion (empty if none)."""
    try:
        choices = json.loads(answer).get("choices") or []
    except ValueError:
        return ""
    return (choices[0].get("message") or {}).get("content") or "" if choices else ""
