"""Token logprobs of a frame, read from a protocol's ``OutputLogProbs``.

vLLM's and SGLang's messages name the same fields (``token_ids``, ``token_logprobs``,
``top_logprobs[i].token_ids`` / ``.values``), so one reader serves both; it touches the
message only through those names.
"""

from __future__ import annotations

from typing import Any

from tandem.gateway.logprobs import LogprobEntry


def entries_from_wire(logprobs: Any) -> list[LogprobEntry]:
    """The entries of one frame, in token order; alternatives where the worker sent them."""
    tops = logprobs.top_logprobs
    entries = []
    for i, (token, value) in enumerate(
        zip(logprobs.token_ids, logprobs.token_logprobs, strict=False)
    ):
        top: tuple[tuple[int, float], ...] = ()
        if i < len(tops):
            top = tuple(zip(tops[i].token_ids, tops[i].values, strict=False))
        entries.append(LogprobEntry(int(token), float(value), top))
    return entries
