"""A rendered prompt's token ids, reused between requests piece by piece.

A chat client sends the whole conversation again at every turn, and an agent the same long
system prompt and tool list with every call: most of each prompt's text was tokenized a
moment ago (about a microsecond a character, on the request path). The ids of the pieces
between the tokenizer's added tokens (``<|im_start|>``, image placeholders…) are kept, and a
prompt is assembled from the pieces already known plus an encode of each new one.

Why that is exact: ``tokenizers`` cuts a text at its added tokens before anything else, then
normalizes and pre-tokenizes each piece on its own, so a text's ids are its pieces' ids end
to end. That holds only where the tokenizer's JSON says so, checked when the model loads:

- every added token is matched on the raw text (``normalized`` false, or no normalizer at
  all) and takes no whitespace beside it nor only whole words (``lstrip``, ``rstrip``,
  ``single_word``), and special tokens are split out (``encode_special_tokens`` off);
- no pre-tokenizer treats the text's first piece apart (Metaspace's ``prepend_scheme``
  "first" does).

A probe set is also encoded both ways at load, and one prompt in :data:`VERIFY_EVERY` after
that; any difference turns the cache off for the model, with a warning. A tokenizer outside
these rules is encoded whole, as without the cache.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections import OrderedDict
from typing import Any

from tokenizers import Tokenizer

from tandem.gateway import metrics
from tandem.gateway.config import DEFAULT_PROMPT_CACHE_TOKENS as DEFAULT_CAPACITY_TOKENS
from tandem.gateway.tokenizing import TooManyTokens, encode_ids

log = logging.getLogger("tandem.gateway")

# Every this many prompts, one is encoded whole as well and compared.
VERIFY_EVERY = 256
# Texts around each added token at load: spaces, newlines and a combining accent beside it.
_PROBES = ("{t}", "a{t}b", " {t} ", "\n{t}\n\n", "x  {t}  y", "e\u0301{t}\u00e9", "{t}{t} {t}")


class PromptTokenCache:
    """Token ids of prompts, assembled from remembered pieces (see the module's docstring)."""

    def __init__(self, tokenizer: Tokenizer, capacity_tokens: int = DEFAULT_CAPACITY_TOKENS):
        self._tokenizer = tokenizer
        self._capacity = capacity_tokens
        self._pieces: OrderedDict[str, list[int]] = OrderedDict()
        self._held = 0  # token ids in _pieces
        self._lock = threading.Lock()  # long prompts are encoded on the tokenizing pool
        self._uses = 0
        self._hit_tokens = metrics.child(metrics.PROMPT_TOKENS, "cache")
        self._encoded_tokens = metrics.child(metrics.PROMPT_TOKENS, "tokenized")
        self._added: dict[str, int] = {}
        self._splitter: re.Pattern[str] | None = None
        reason = "turned off" if capacity_tokens <= 0 else _unsafe_reason(tokenizer)
        if reason is None:
            added = tokenizer.get_added_tokens_decoder()
            self._added = {token.content: token_id for token_id, token in added.items()}
            # Longest first: at one position the longest added token wins, as in tokenizers.
            contents = sorted(self._added, key=len, reverse=True)
            splitter = re.compile("(" + "|".join(map(re.escape, contents)) + ")")
            reason = self._probe_mismatch(splitter)
            if reason is None:
                self._splitter = splitter
        self.off_reason = reason

    @property
    def enabled(self) -> bool:
        return self._splitter is not None

    def encode(self, text: str, at_most: int | None = None) -> list[int]:
        """``text``'s ids, as :func:`encode_ids` gives them; :class:`TooManyTokens` past
        ``at_most``."""
        splitter = self._splitter
        if splitter is None:
            ids = encode_ids(self._tokenizer, text, at_most=at_most)
            self._encoded_tokens.inc(len(ids))
            return ids
        ids, fresh = self._assembled(splitter.split(text), at_most)
        self._encoded_tokens.inc(fresh)
        self._hit_tokens.inc(len(ids) - fresh)
        self._uses += 1
        if self._uses % VERIFY_EVERY == 0:
            self._verify(text, ids)
        return ids

    def _assembled(self, parts: list[str], at_most: int | None) -> tuple[list[int], int]:
        """The ids of ``parts`` (``re.split`` with one group: the even ones are text between
        added tokens, the odd ones added tokens), and how many of them were encoded now."""
        texts = parts[0::2]
        known: dict[str, list[int]] = {}
        missing: list[str] = []
        with self._lock:
            for piece in texts:
                if not piece or piece in known:
                    continue
                ids = self._pieces.get(piece)
                if ids is None:
                    missing.append(piece)
                    known[piece] = []  # filled in once encoded, below
                else:
                    self._pieces.move_to_end(piece)
                    known[piece] = ids
        encodings = _encode_batch(self._tokenizer, missing) if missing else []
        if at_most is not None:
            # Counted before any ids become Python ints: a refused prompt costs no more.
            lengths = {
                piece: len(encoding) for piece, encoding in zip(missing, encodings, strict=True)
            }
            count = len(parts) // 2 + sum(lengths.get(p, len(known[p])) for p in texts if p)
            if count > at_most:
                raise TooManyTokens(count)
        fresh = 0
        for piece, encoding in zip(missing, encodings, strict=True):
            known[piece] = encoding.ids
            fresh += len(known[piece])
        out: list[int] = []
        added = self._added
        for i, part in enumerate(parts):
            if i % 2:
                out.append(added[part])
            elif part:
                out.extend(known[part])
        if missing:
            self._remember(missing, known)
        return out, fresh

    def _remember(self, missing: list[str], known: dict[str, list[int]]) -> None:
        with self._lock:
            for piece in missing:
                ids = known[piece]
                if len(ids) > self._capacity // 4 or piece in self._pieces:
                    continue  # one huge text would push out everything else
                self._pieces[piece] = ids
                self._held += len(ids)
            while self._held > self._capacity:
                _, dropped = self._pieces.popitem(last=False)
                self._held -= len(dropped)

    def _verify(self, text: str, ids: list[int]) -> None:
        whole = encode_ids(self._tokenizer, text)
        if whole != ids:
            log.warning(
                "prompt token cache: a prompt's pieces encode differently from the whole "
                "text; the cache is off for this model"
            )
            self.off_reason = "a prompt's pieces encoded differently"
            self._splitter = None
            with self._lock:
                self._pieces.clear()
                self._held = 0

    def _probe_mismatch(self, splitter: re.Pattern[str]) -> str | None:
        for token in list(self._added)[:64]:
            for probe in _PROBES:
                text = probe.format(t=token)
                pieces, _ = self._assembled(splitter.split(text), None)
                if pieces != encode_ids(self._tokenizer, text):
                    return f"pieces around {token!r} encode differently"
        with self._lock:
            self._pieces.clear()
            self._held = 0
        return None


def _encode_batch(tokenizer: Tokenizer, texts: list[str]) -> list[Any]:
    # One text a call: a batch of several is spread over tokenizers' thread pool, which
    # cost 12 to 25 % more CPU than encoding them in turn (measured on a chat's pieces).
    fast = getattr(tokenizer, "encode_batch_fast", None)
    if fast is not None:
        return [fast([text], add_special_tokens=False)[0] for text in texts]
    return [tokenizer.encode(text, add_special_tokens=False) for text in texts]


def _unsafe_reason(tokenizer: Tokenizer) -> str | None:
    """Why this tokenizer's pieces may not encode as its whole text (None: they do)."""
    if tokenizer.truncation is not None or tokenizer.padding is not None:
        return "the tokenizer truncates or pads"
    if getattr(tokenizer, "encode_special_tokens", False):
        return "special tokens are not split out (encode_special_tokens)"
    added = tokenizer.get_added_tokens_decoder().values()
    if not added:
        return "no added tokens to split at"
    spec = json.loads(tokenizer.to_str())
    for token in added:
        if token.lstrip or token.rstrip or token.single_word:
            return f"added token {token.content!r} strips whitespace or matches whole words"
        if token.normalized and spec.get("normalizer") is not None:
            return f"added token {token.content!r} is matched after normalization"
    if _has_first_only_prefix(spec.get("pre_tokenizer")):
        return "the pre-tokenizer treats the first piece apart (prepend_scheme 'first')"
    return None


def _has_first_only_prefix(node: Any) -> bool:
    if isinstance(node, dict):
        if node.get("prepend_scheme") == "first":
            return True
        return any(_has_first_only_prefix(v) for v in node.values())
    if isinstance(node, list):
        return any(_has_first_only_prefix(v) for v in node)
    return False
