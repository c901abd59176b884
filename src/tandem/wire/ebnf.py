"""EBNF grammar text for a list of exact strings, as the grammar engines workers use read it.

The gateway writes it where a protocol has no choice constraint of its own (SGLang's
``ebnf_grammar``); Tandem's engine compiles a vLLM ``choice`` constraint from the same text,
so both paths constrain alike.
"""

from __future__ import annotations


def choice_grammar(choices: tuple[str, ...] | list[str]) -> str:
    """An EBNF grammar whose language is exactly the given literal strings."""
    return "root ::= " + " | ".join(f'"{_ebnf_literal(c)}"' for c in choices)


_NAMED_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _ebnf_literal(text: str) -> str:
    out = []
    for ch in text:
        if ch in _NAMED_ESCAPES:
            out.append(_NAMED_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            # Other control characters as \uXXXX: xgrammar reads them back exactly.
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return "".join(out)
