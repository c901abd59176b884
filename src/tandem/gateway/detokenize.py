"""Incremental detokenization: token ids in, newly completed text out.

Two problems make "decode the new token alone" wrong:

* byte-level BPE tokens can end in the middle of a UTF-8 character; decoding
  such a tail yields U+FFFD, which must not be streamed while the rest of the
  character may still come;
* some decoders (SentencePiece ``Metaspace``) render a token differently at
  the start of a text (the leading space is dropped), so a token decoded alone
  can lose its space.

So each step decodes a short window ``ids[prefix:]`` and emits only what it
adds over ``ids[prefix:read]``, the part already emitted. Both offsets sit on
character boundaries, so the window stays a few tokens long and the cost per
token does not grow with the output. (A run of tokens that each end inside a
character keeps the offsets still, so the window grows for as long as the run.)
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer

REPLACEMENT = "\ufffd"
# Prompt tokens decoded as left context for the first output token.
PROMPT_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    """Turns one sequence's output token ids into text, piece by piece.

    ``push`` returns only complete characters; ``flush`` returns whatever is held
    back once generation is over (an unfinished character then reads as U+FFFD,
    as it does in a one-shot decode). Concatenating every ``push`` and the
    ``flush`` gives ``tokenizer.decode(all_ids)``.

    ``prompt_ids`` (optional) supply left context so the first output token
    renders as it would after the prompt, e.g. with its leading space.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        skip_special_tokens: bool = True,
        prompt_ids: Sequence[int] = (),
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        context = list(prompt_ids[-PROMPT_CONTEXT_TOKENS:])
        # Context ending mid-character would make its text change once output arrives,
        # breaking the "emit only what the window adds" arithmetic: go without it.
        if self._decode(context).endswith(REPLACEMENT):
            context = []
        self._ids: list[int] = context
        self._context_len = len(context)
        self._prefix = 0  # start of the decode window
        self._read = len(context)  # ids before this are already emitted
        self._prefix_text: str | None = None  # decode of ids[prefix:read], cached
        self._emitted = 0  # chars past prefix_text already released while read is unchanged

    def _decode(self, ids: Sequence[int]) -> str:
        if not ids:
            return ""
        return self._tokenizer.decode(list(ids), skip_special_tokens=self._skip_special)

    @property
    def token_ids(self) -> list[int]:
        """The output ids pushed so far (prompt context excluded)."""
        return self._ids[self._context_len :]

    def push(self, token_ids: Sequence[int]) -> str:
        """Add output tokens; return the text they complete (possibly empty)."""
        if not token_ids:
            return ""
        self._ids.extend(token_ids)
        return self._advance(final=False)

    def flush(self) -> str:
        """End of output: return all held-back text, incomplete characters included."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        if self._read == len(self._ids):
            return ""
        if self._prefix_text is None:
            self._prefix_text = self._decode(self._ids[self._prefix : self._read])
        text = self._decode(self._ids[self._prefix :])
        start = len(self._prefix_text) + self._emitted
        if not final and text.endswith(REPLACEMENT):
            # The trailing U+FFFD run may be a character still in progress; everything
            # before it is settled, so release that (a token can finish one character
            # and begin the next) but keep the offsets, which must sit on a boundary.
            end = len(text.rstrip(REPLACEMENT))
            if end <= start:
                return ""
            self._emitted = end - len(self._prefix_text)
            return text[start:end]
        if not final and len(text) <= start:
            # Nothing new (e.g. skipped special tokens): let the window grow instead.
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        self._prefix_text = None
        self._emitted = 0
        return text[start:]
