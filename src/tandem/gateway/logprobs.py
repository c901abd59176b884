"""Token logprobs from the workers, rendered in OpenAI's chat and legacy-completions shapes.

Workers send ids and numbers (each protocol's frames are read into :class:`LogprobEntry`);
the gateway turns ids into the token's text and bytes with its own tokenizer. The text is
the token decoded alone (a token that ends inside a UTF-8 character reads as U+FFFD, as in
vLLM's server); the bytes are exact for byte-level tokenizers, where the token's spelling
maps back to them one character a byte, so a client can rebuild multi-byte characters from
consecutive tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tokenizers import Tokenizer

from tandem.models.byte_level import token_bytes

# JSON has no -inf: a masked alternative is reported with vLLM's floor.
LOGPROB_FLOOR = -9999.0


@dataclass(frozen=True, slots=True)
class LogprobEntry:
    """One output token: its logprob and the top alternatives (highest first)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def _finite(value: float) -> float:
    return value if math.isfinite(value) else LOGPROB_FLOOR


class TokenStrings:
    """Text and bytes of single tokens, cached per id (a vocabulary is bounded)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._byte_level = type(tokenizer.decoder).__name__ == "ByteLevel"
        # Added (special) tokens are spelled as their text, not in the byte alphabet.
        self._added = frozenset(t.content for t in tokenizer.get_added_tokens_decoder().values())
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def get(self, token_id: int) -> tuple[str, list[int]]:
        """The token's text alone and its bytes."""
        hit = self._cache.get(token_id)
        if hit is None:
            text = self._tokenizer.decode([token_id], skip_special_tokens=False)
            spelling = self._tokenizer.id_to_token(token_id)
            raw = None
            if self._byte_level and spelling is not None and spelling not in self._added:
                raw = token_bytes(spelling)
            hit = (text, list(raw if raw is not None else text.encode("utf-8")))
            self._cache[token_id] = hit
        return hit


def chat_content(entries: Sequence[LogprobEntry], strings: TokenStrings) -> list[dict[str, Any]]:
    """``logprobs.content`` of a chat choice (or of one streamed delta)."""
    content = []
    for entry in entries:
        text, raw = strings.get(entry.token_id)
        alternatives = []
        for token, value in entry.top:
            alt_text, alt_raw = strings.get(token)
            alternatives.append({"token": alt_text, "logprob": _finite(value), "bytes": alt_raw})
        content.append(
            {
                "token": text,
                "logprob": _finite(entry.logprob),
                "bytes": raw,
                "top_logprobs": alternatives,
            }
        )
    return content


def chat_logprobs(entries: Sequence[LogprobEntry], strings: TokenStrings) -> dict[str, Any]:
    return {"content": chat_content(entries, strings), "refusal": None}


class CompletionLogprobs:
    """Legacy completions' ``logprobs`` object, built delta by delta for one choice.

    ``text_offset`` counts characters of the tokens' own texts from the start of the
    choice's text, continuing across streamed chunks. ``top_logprobs`` maps token text to
    logprob; as in vLLM's server it holds the sampled token beside the alternatives, and is
    null for a token when no alternatives were asked for.
    """

    def __init__(self, strings: TokenStrings, alternatives: int) -> None:
        self._strings = strings
        self._alternatives = alternatives
        self._offset = 0

    def render(self, entries: Sequence[LogprobEntry]) -> dict[str, Any]:
        tokens: list[str] = []
        values: list[float] = []
        tops: list[dict[str, float] | None] = []
        offsets: list[int] = []
        for entry in entries:
            text, _ = self._strings.get(entry.token_id)
            tokens.append(text)
            values.append(_finite(entry.logprob))
            offsets.append(self._offset)
            self._offset += len(text)
            if self._alternatives:
                top = {self._strings.get(t)[0]: _finite(v) for t, v in entry.top}
                top.setdefault(text, _finite(entry.logprob))
                tops.append(top)
            else:
                tops.append(None)
        return {
            "tokens": tokens,
            "token_logprobs": values,
            "top_logprobs": tops,
            "text_offset": offsets,
        }
