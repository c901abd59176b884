"""IncrementalDetokenizer against real byte-level BPE tokenizers built here."""

from __future__ import annotations

from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from tandem.gateway.detokenize import PROMPT_CONTEXT_TOKENS, REPLACEMENT, IncrementalDetokenizer

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Emoji share their first two bytes and CJK characters their first; a small merge budget
# then learns tokens such as "tail of 漢 + head of 字" that straddle character boundaries.
CORPUS = ["😀🎉🚀🙂🔥👍 漢字語文中国 é è ü ö café"] * 10


@cache
def byte_tokenizer(merges: bool) -> Tokenizer:
    """Byte-level BPE: 256 byte symbols, the specials, then (with ``merges``) learned merges."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=272 if merges else 256 + len(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=list(SPECIALS),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.add_tokens(["<tool>"])  # an added token that is not special: never skipped
    return tok


@cache
def byte_fallback_tokenizer() -> Tokenizer:
    """SentencePiece/Llama style: ▁-words, unknown characters fall back to <0xNN> tokens."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab |= {f"<0x{b:02X}>": 3 + b for b in range(256)}
    for piece in ["▁", *"abcdefghijklmnopqrstuvwxyz", "▁a", "▁b"]:
        vocab[piece] = len(vocab)
    model = models.BPE(
        vocab=vocab, merges=[("▁", "a"), ("▁", "b")], byte_fallback=True, unk_token="<unk>"
    )
    tok = Tokenizer(model)
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    tok.add_special_tokens(["<s>", "</s>"])
    return tok


def stream(detok: IncrementalDetokenizer, ids: list[int], sizes: list[int]) -> list[str]:
    """Push ``ids`` in chunks of the given sizes (cycled), then flush; return every piece."""
    pieces, i, k = [], 0, 0
    while i < len(ids):
        size = sizes[k % len(sizes)] if sizes else 1
        pieces.append(detok.push(ids[i : i + size]))
        i, k = i + size, k + 1
    pieces.append(detok.flush())
    return pieces


@pytest.mark.parametrize(
    ("merges", "text"),
    [(False, "café"), (False, "a😀b漢c é"), (True, "漢字"), (True, "😀🎉"), (True, "a😀b漢c é")],
)
def test_multibyte_characters_come_out_whole(merges: bool, text: str) -> None:
    tok = byte_tokenizer(merges)
    ids = tok.encode(text).ids
    # The test only means something if some token boundary falls inside a character.
    assert any(tok.decode(ids[:k]).endswith(REPLACEMENT) for k in range(1, len(ids)))
    pieces = stream(IncrementalDetokenizer(tok), ids, [1])
    assert "".join(pieces) == text
    assert all(REPLACEMENT not in p for p in pieces)


def test_straddling_token_releases_completed_character_only() -> None:
    tok = byte_tokenizer(True)
    ids = tok.encode("漢字").ids
    assert len(ids) == 4
    detok = IncrementalDetokenizer(tok)
    emitted = [detok.push([i]) for i in ids]
    # Each character appears exactly when its last byte arrives, never as U+FFFD.
    assert "".join(emitted) + detok.flush() == "漢字"
    # Token 2 finishes 漢 and begins 字: 漢 is released then, not held until 字 is done.
    assert emitted == ["", "漢", "", "字"]


def test_flush_releases_an_unfinished_character_like_decode_does() -> None:
    tok = byte_tokenizer(False)
    first_byte = tok.encode("漢").ids[:1]
    detok = IncrementalDetokenizer(tok)
    assert detok.push(first_byte) == ""
    assert detok.flush() == tok.decode(first_byte) == REPLACEMENT
    assert detok.flush() == ""


def test_special_tokens_skipped_or_kept() -> None:
    tok = byte_tokenizer(True)
    end = tok.token_to_id("<|im_end|>")
    tool = tok.token_to_id("<tool>")
    ids = [*tok.encode("hi").ids, end, tool, *tok.encode("é").ids]
    skipped = stream(IncrementalDetokenizer(tok), ids, [1])
    kept = stream(IncrementalDetokenizer(tok, skip_special_tokens=False), ids, [1])
    assert "".join(skipped) == "hi<tool>é"
    assert "".join(kept) == "hi<|im_end|><tool>é"


def test_empty_push_and_token_ids() -> None:
    tok = byte_tokenizer(False)
    detok = IncrementalDetokenizer(tok, prompt_ids=tok.encode("prompt").ids)
    assert detok.push([]) == ""
    assert detok.push(tok.encode("ok").ids) == "ok"
    assert detok.token_ids == tok.encode("ok").ids


class _CountingTokenizer:
    """Records how many ids each decode call gets."""

    def __init__(self, inner: Tokenizer) -> None:
        self.inner = inner
        self.window_lengths: list[int] = []

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        self.window_lengths.append(len(ids))
        return self.inner.decode(ids, skip_special_tokens=skip_special_tokens)


def test_decode_window_stays_short() -> None:
    tok = byte_tokenizer(True)
    ids = tok.encode("😀 漢字 café " * 300).ids
    spy = _CountingTokenizer(tok)
    pieces = stream(IncrementalDetokenizer(spy), ids, [1])  # type: ignore[arg-type]
    assert "".join(pieces) == tok.decode(ids)
    # A character spans at most 4 byte tokens, so the window is never longer than ~8.
    assert max(spy.window_lengths) <= 8
    assert len(spy.window_lengths) <= 2 * len(ids) + 1


def test_prompt_context_keeps_a_leading_space() -> None:
    # SentencePiece-style: the Metaspace decoder drops the space of a text's first token.
    tok = Tokenizer(models.WordLevel({"▁Hello": 0, "▁world": 1, "<unk>": 2}, unk_token="<unk>"))
    tok.decoder = decoders.Metaspace()
    assert IncrementalDetokenizer(tok).push([1]) == "world"
    assert IncrementalDetokenizer(tok, prompt_ids=[0]).push([1]) == " world"


def test_prompt_context_ending_mid_character_is_dropped() -> None:
    tok = byte_tokenizer(False)
    half = tok.encode("漢").ids[:2]
    detok = IncrementalDetokenizer(tok, prompt_ids=half)
    assert detok.push(tok.encode("ab").ids) == "ab"


@settings(max_examples=150, deadline=None)
@given(
    text=st.text(max_size=60),
    merges=st.booleans(),
    skip=st.booleans(),
    sizes=st.lists(st.integers(1, 5), max_size=6),
    specials=st.lists(st.tuples(st.integers(0, 200), st.sampled_from(range(4))), max_size=3),
)
def test_pushes_plus_flush_equal_one_shot_decode(
    text: str, merges: bool, skip: bool, sizes: list[int], specials: list[tuple[int, int]]
) -> None:
    tok = byte_tokenizer(merges)
    ids = tok.encode(text).ids
    for pos, special in specials:  # ids 0..2 are the specials; 3 is a byte symbol
        ids.insert(pos % (len(ids) + 1), special)
    pieces = stream(IncrementalDetokenizer(tok, skip_special_tokens=skip), ids, sizes)
    assert "".join(pieces) == tok.decode(ids, skip_special_tokens=skip)
    if REPLACEMENT not in tok.decode(ids, skip_special_tokens=skip):
        assert all(REPLACEMENT not in p for p in pieces)


@settings(max_examples=150, deadline=None)
@given(
    ids=st.lists(st.integers(0, 271), max_size=40),
    sizes=st.lists(st.integers(1, 4), max_size=5),
    prompt=st.lists(st.integers(0, 271), max_size=8),
)
def test_arbitrary_ids_even_invalid_utf8_match_decode(
    ids: list[int], sizes: list[int], prompt: list[int]
) -> None:
    tok = byte_tokenizer(True)
    pieces = stream(IncrementalDetokenizer(tok, prompt_ids=prompt), ids, sizes)
    assert "".join(pieces) == tok.decode(ids)


@settings(max_examples=100, deadline=None)
@given(
    text=st.text(alphabet="ab xyz é漢😀", max_size=30),
    sizes=st.lists(st.integers(1, 4), max_size=5),
    prompt=st.text(alphabet="ab xy", max_size=6),
)
def test_byte_fallback_tokenizer_matches_decode(text: str, sizes: list[int], prompt: str) -> None:
    tok = byte_fallback_tokenizer()
    ids = tok.encode(text).ids
    prompt_ids = tok.encode(prompt).ids if prompt else []
    pieces = stream(IncrementalDetokenizer(tok, prompt_ids=prompt_ids), ids, sizes)
    assert all(REPLACEMENT not in p for p in pieces)
    # Oracle: the output as it reads after the prompt, i.e. decode(context + output) minus
    # decode(context); for a prompt-less stream that is plain decode(output).
    context = prompt_ids[-PROMPT_CONTEXT_TOKENS:]
    expected = tok.decode(context + ids)[len(tok.decode(context)) :]
    assert "".join(pieces) == expected
    if not context:
        assert expected == tok.decode(ids)
