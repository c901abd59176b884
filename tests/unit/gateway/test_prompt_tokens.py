"""The prompt token cache gives the ids of tokenizing the whole prompt, on real tokenizers.

Tokenizers here are the built-in models' (built from their specs) and trained BPEs in the
styles of real checkpoints (a Qwen-like NFC + split + byte-level one, a Llama-like Metaspace
one), each compared with a whole-text encode over many generated prompts.
"""

from __future__ import annotations

import random

import pytest
from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers, trainers

from tandem.engine.builtin_specs import TINY_LLAVA, TINY_QWEN3_VL
from tandem.engine.builtin_tokenizer import build_tokenizer
from tandem.gateway import metrics, prompt_tokens
from tandem.gateway.prompt_tokens import PromptTokenCache
from tandem.gateway.tokenizing import TooManyTokens, encode_ids

SPECIALS = ["<|im_start|>", "<|im_end|>", "<|image_pad|>", "<|vision_start|>", "<think>"]
WORDS = ["the", " fox", "  jumps", "\n", "\n\n", "é", "e\u0301", "日本語", "🙂", "x", "  ", "12"]
CORPUS = ["the quick brown fox jumps over the lazy dog 12 times", "日本語 テキスト", "é e\u0301"]


def trained(pre_tokenizer: object, normalizer: object | None, normalized: bool) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.normalizer = normalizer  # type: ignore[assignment]
    tokenizer.pre_tokenizer = pre_tokenizer  # type: ignore[assignment]
    trainer = trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tokenizer.train_from_iterator(CORPUS * 20, trainer)
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=normalized) for t in SPECIALS]
    )
    return tokenizer


def qwen_like() -> Tokenizer:
    split = pre_tokenizers.Split(r"\s?\w+|\s+(?!\S)|\s+|[^\s\w]+", "isolated")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    return trained(pre_tokenizers.Sequence([split, byte_level]), normalizers.NFC(), False)


def llama_like() -> Tokenizer:
    metaspace = pre_tokenizers.Metaspace(prepend_scheme="always")
    return trained(metaspace, None, False)


def builtin(spec: object) -> Tokenizer:
    return build_tokenizer(spec.special_tokens)  # type: ignore[attr-defined]


def chat(rng: random.Random, specials: list[str], turns: int) -> list[str]:
    """Prompts of a growing conversation: each one is the last plus a new turn."""
    prompts, text = [], ""
    for _ in range(turns):
        body = "".join(rng.choice(WORDS + specials) for _ in range(rng.randint(0, 30)))
        text += f"{specials[0]}user\n{body}{specials[1]}\n"
        prompts.append(text + f"{specials[0]}assistant\n")
    return prompts


TOKENIZERS = {
    "tiny-qwen3-vl": lambda: builtin(TINY_QWEN3_VL),
    "tiny-llava": lambda: builtin(TINY_LLAVA),
    "qwen-like": qwen_like,
    "llama-like": llama_like,
}


@pytest.mark.parametrize("name", sorted(TOKENIZERS))
def test_ids_equal_a_whole_encode_turn_after_turn(name: str) -> None:
    tokenizer = TOKENIZERS[name]()
    cache = PromptTokenCache(tokenizer, capacity_tokens=4096)
    assert cache.enabled, cache.off_reason
    specials = [t.content for t in tokenizer.get_added_tokens_decoder().values()]
    rng = random.Random(7)
    for _ in range(40):
        for prompt in chat(rng, specials, turns=5):
            assert cache.encode(prompt) == encode_ids(tokenizer, prompt), repr(prompt)


def tokens(source: str) -> float:
    value = metrics.REGISTRY.get_sample_value("tandem_prompt_tokens_total", {"source": source})
    return value or 0.0


def test_a_next_turn_tokenizes_only_what_is_new() -> None:
    tokenizer = builtin(TINY_QWEN3_VL)
    cache = PromptTokenCache(tokenizer)
    first = "<|im_start|>system\n" + "be brief " * 200 + "<|im_end|>\n<|im_start|>user\nhi"
    second = first + "<|im_end|>\n<|im_start|>user\nand now?"
    cache.encode(first)
    before_cached, before_tokenized = tokens("cache"), tokens("tokenized")
    ids = cache.encode(second)
    assert ids == encode_ids(tokenizer, second)
    # New: the last turn's piece (one token a byte); the rest came from the cache.
    new = len("user\nand now?")
    assert tokens("tokenized") - before_tokenized == new
    assert tokens("cache") - before_cached == len(ids) - new


def test_too_many_tokens_is_counted_from_cached_and_new_pieces() -> None:
    tokenizer = builtin(TINY_QWEN3_VL)
    cache = PromptTokenCache(tokenizer)
    prompt = "<|im_start|>user\n" + "a" * 50 + "<|im_end|>"
    whole = len(encode_ids(tokenizer, prompt))
    for _ in range(2):  # a miss, then a hit
        with pytest.raises(TooManyTokens) as refused:
            cache.encode(prompt, at_most=whole - 1)
        assert refused.value.count == whole
    assert cache.encode(prompt, at_most=whole) == encode_ids(tokenizer, prompt)


def test_the_cache_stays_within_its_token_budget() -> None:
    tokenizer = builtin(TINY_QWEN3_VL)
    cache = PromptTokenCache(tokenizer, capacity_tokens=1000)
    for i in range(100):
        cache.encode(f"<|im_start|>user\nmessage number {i} " + "z" * 40 + "<|im_end|>")
        assert cache._held <= 1000
    big = "<|im_start|>" + "q" * 600 + "<|im_end|>"  # over a quarter of the budget
    assert cache.encode(big) == encode_ids(tokenizer, big)
    assert "q" * 600 not in cache._pieces


def strip_token() -> Tokenizer:
    tokenizer = builtin(TINY_QWEN3_VL)
    tokenizer.add_special_tokens([AddedToken("<mask>", lstrip=True, normalized=False)])
    return tokenizer


def first_only_metaspace() -> Tokenizer:
    return trained(pre_tokenizers.Metaspace(prepend_scheme="first"), None, False)


def normalized_specials() -> Tokenizer:
    return trained(pre_tokenizers.ByteLevel(), normalizers.NFC(), True)


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (strip_token, "strips whitespace"),
        (first_only_metaspace, "prepend_scheme"),
        (normalized_specials, "after normalization"),
    ],
)
def test_tokenizers_whose_pieces_may_differ_are_encoded_whole(make: object, reason: str) -> None:
    tokenizer = make()  # type: ignore[operator]
    cache = PromptTokenCache(tokenizer)
    assert not cache.enabled
    assert reason in (cache.off_reason or "")
    prompt = "<|im_start|> a <mask> b\n<|im_end|>"
    assert cache.encode(prompt) == encode_ids(tokenizer, prompt)


def test_turned_off_with_a_zero_budget() -> None:
    cache = PromptTokenCache(builtin(TINY_QWEN3_VL), capacity_tokens=0)
    assert not cache.enabled and cache.off_reason == "turned off"


def test_a_checked_prompt_that_differs_turns_the_cache_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tokenizer = builtin(TINY_QWEN3_VL)
    cache = PromptTokenCache(tokenizer)
    monkeypatch.setattr(prompt_tokens, "VERIFY_EVERY", 1)
    prompt = "<|im_start|>user\nhello<|im_end|>"
    cache.encode(prompt)
    cache._pieces["user\nhello"] = [1, 2, 3]  # a piece whose ids went wrong
    cache.encode(prompt)  # checked: differs from the whole encode
    assert not cache.enabled
    assert cache.encode(prompt) == encode_ids(tokenizer, prompt)
