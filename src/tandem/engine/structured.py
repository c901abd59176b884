"""Constrained decoding with xgrammar, vLLM's default structured-output backend.

Built the way vLLM builds it, so that the token masks are the same: one
``xgr.GrammarCompiler`` per model (its cache keeps compiled grammars), made from
``TokenizerInfo.from_huggingface`` over the checkpoint's own tokenizer with the model's
vocabulary size; ``json_object`` is the schema ``{"type": "object"}``; a choice list is an
EBNF alternation; a grammar that looks like Lark compiles as Lark, else as EBNF (GBNF).
Each sample gets its own matcher whose stop tokens are the model's eos ids plus the
request's ``stop_token_ids``.

One choice differs from vLLM's default: JSON (schemas, ``json_object``, forced tool calls)
compiles **compact** unless the worker runs with ``--json-whitespace any``. vLLM lets the
grammar take any run of whitespace between JSON tokens, which a model can pick forever and
so never finish (a forced call padded until ``max_tokens``); compact JSON is vLLM's
``disable_any_whitespace`` (one space after ``,`` and ``:``, nothing else), and still the
same documents (docs/operations.md, "Structured outputs").

xgrammar is imported on first use: a worker without it starts and serves everything but
constrained requests, which it refuses (``unsupported_parameter``). Where a step applies
the mask: ``engine/sampling.py``.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from tandem.engine.structured_spec import (
    Constraint,
    StructuredOutputError,
    looks_like_lark,
)
from tandem.wire.ebnf import choice_grammar

# Compiled grammars the compiler keeps for reuse, at most (vLLM's default budget too).
COMPILER_CACHE_BYTES = 512 << 20
XGRAMMAR_MISSING = (
    "structured outputs need xgrammar on this worker (make install, or pip install "
    "'tandem[structured]')"
)

# "[12:34:56] /project/cpp/regex_converter.cc:83: " and "Check failed: (…) is false: "
# say where in xgrammar's C++ a check failed, which tells a client nothing.
_NATIVE_PREFIX = re.compile(r"\[\d{2}:\d{2}:\d{2}\] \S+?:\d+: ")
_CHECK_FAILED = re.compile(r"Check failed: \(.*?\) is false: ")


def readable(exc: BaseException) -> str:
    """xgrammar's error message without the C++ source location and check text."""
    text = _CHECK_FAILED.sub("", _NATIVE_PREFIX.sub("", str(exc))).strip()
    return " ".join(text.split()) or type(exc).__name__


def xgrammar() -> ModuleType:
    """The xgrammar module, or StructuredOutputError (unsupported_parameter) without it."""
    try:
        import xgrammar as xgr
    except ImportError:
        raise StructuredOutputError(XGRAMMAR_MISSING, "unsupported_parameter") from None
    return xgr


@dataclass(frozen=True, slots=True)
class CompiledConstraint:
    """A constraint compiled against one model's vocabulary, ready for per-sample matchers."""

    kind: str
    grammar: Any  # xgr.CompiledGrammar
    stop_token_ids: tuple[int, ...]
    vocab_size: int

    def matcher(self) -> TokenMatcher:
        return TokenMatcher(self)


class TokenMatcher:
    """Follows one sample through the grammar: masks its logits, then takes its token."""

    def __init__(self, compiled: CompiledConstraint) -> None:
        self._xgr = xgrammar()
        self._matcher = self._xgr.GrammarMatcher(
            compiled.grammar, override_stop_tokens=list(compiled.stop_token_ids) or None
        )
        self._bitmask = self._xgr.allocate_token_bitmask(1, compiled.vocab_size)
        self._vocab_size = compiled.vocab_size

    def apply_mask(self, scores: torch.Tensor) -> None:
        """Set the scores ([vocab] float32, CPU) of every token the grammar forbids to -inf."""
        self._matcher.fill_next_token_bitmask(self._bitmask)
        self._xgr.apply_token_bitmask_inplace(scores, self._bitmask, vocab_size=self._vocab_size)

    def accept(self, token: int) -> bool:
        """Advance by ``token``; False (matcher unchanged) when the grammar forbids it."""
        return bool(self._matcher.accept_token(token))

    @property
    def terminated(self) -> bool:
        """The grammar is complete and its stop token taken: nothing may follow."""
        return bool(self._matcher.is_terminated())


class StructuredCompiler:
    """Compiles constraints for one model; built on the first constrained request.

    Thread-safe: the servicer compiles off the event loop, possibly for several requests
    at once. The xgrammar compiler itself is safe to share; only its construction is
    guarded.
    """

    def __init__(
        self, model_dir: str | Path, vocab_size: int, *, any_whitespace: bool = False
    ) -> None:
        self.model_dir = Path(model_dir)
        self.vocab_size = vocab_size
        self.any_whitespace = any_whitespace
        self._lock = threading.Lock()
        self._compiler: Any = None

    def compile(self, constraint: Constraint, stop_token_ids: Sequence[int]) -> CompiledConstraint:
        """Compile ``constraint`` (blocking); StructuredOutputError if it cannot be."""
        constraint.check()
        xgr = xgrammar()
        compiler = self._get_compiler(xgr)
        try:
            grammar = _compile(xgr, compiler, constraint, self.any_whitespace)
        except StructuredOutputError:
            raise
        except Exception as exc:
            # xgrammar raises RuntimeError/ValueError/TypeError for bad input; any of them
            # here is the request's fault, reported in xgrammar's own (cleaned) words.
            raise StructuredOutputError(f"{constraint.kind}: {readable(exc)}") from None
        stops = tuple(dict.fromkeys(int(t) for t in stop_token_ids))
        return CompiledConstraint(constraint.kind, grammar, stops, self.vocab_size)

    def _get_compiler(self, xgr: ModuleType) -> Any:
        with self._lock:
            if self._compiler is None:
                import transformers

                tokenizer = transformers.AutoTokenizer.from_pretrained(self.model_dir)
                info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=self.vocab_size)
                self._compiler = xgr.GrammarCompiler(
                    info, max_threads=8, cache_enabled=True, cache_limit_bytes=COMPILER_CACHE_BYTES
                )
            return self._compiler


def _compile(xgr: ModuleType, compiler: Any, constraint: Constraint, any_whitespace: bool) -> Any:
    kind, spec = constraint.kind, constraint.spec
    if kind == "json_schema":
        return compiler.compile_json_schema(spec, any_whitespace=any_whitespace)
    if kind == "json_object":
        return compiler.compile_json_schema('{"type": "object"}', any_whitespace=any_whitespace)
    if kind == "regex":
        return compiler.compile_regex(spec)
    if kind == "choice":
        return compiler.compile_grammar(choice_grammar(constraint.choices))
    if kind == "grammar":
        if looks_like_lark(spec):
            return compiler.compile_lark(spec)
        return compiler.compile_grammar(spec)
    if kind == "structural_tag":
        tag = json.loads(spec)
        if isinstance(tag, dict) and "structures" in tag:
            # The older form: begin/schema/end items and their trigger strings.
            try:
                items = [
                    xgr.StructuralTagItem(
                        begin=s["begin"], schema=json.dumps(s["schema"]), end=s["end"]
                    )
                    for s in tag["structures"]
                ]
                triggers = tag["triggers"]
            except (KeyError, TypeError) as exc:
                raise StructuredOutputError(
                    f"structural_tag: each of structures needs begin, schema and end, and "
                    f"the tag needs triggers ({exc!r} missing or malformed)"
                ) from None
            return compiler.compile_structural_tag(items, triggers)
        return compiler.compile_structural_tag(spec)
    raise StructuredOutputError(f"unknown constraint kind {kind!r}")
