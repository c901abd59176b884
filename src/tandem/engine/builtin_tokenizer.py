"""Byte-level tokenizer of the built-in models, built with the `tokenizers` library.

Ids 0..255 are the 256 byte symbols (GPT-2 byte-to-unicode alphabet, id ==
byte value), no merges, then the family's special tokens. Any UTF-8 text
encodes and decodes back exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from tandem.engine.builtin_specs import BuiltinSpec
from tandem.models.byte_level import byte_symbols


def build_tokenizer(special_tokens: tuple[str, ...]) -> Tokenizer:
    vocab = {symbol: byte for byte, symbol in enumerate(byte_symbols())}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in special_tokens]
    )
    return tokenizer


def write_tokenizer_files(directory: Path, spec: BuiltinSpec) -> None:
    tokenizer = build_tokenizer(spec.special_tokens)
    if tokenizer.get_vocab_size(with_added_tokens=True) != spec.vocab_size:
        raise RuntimeError(f"{spec.name}: tokenizer size does not match the model's vocab")
    tokenizer.save(str(directory / "tokenizer.json"))
    _write_json(directory / "tokenizer_config.json", spec.tokenizer_config)
    named = {
        key: spec.tokenizer_config[key]
        for key in ("bos_token", "eos_token", "pad_token")
        if spec.tokenizer_config.get(key)
    }
    named["additional_special_tokens"] = [t for t in spec.special_tokens if t not in named.values()]
    _write_json(directory / "special_tokens_map.json", named)


def _write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
