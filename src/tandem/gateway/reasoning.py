"""Reasoning in model output: ``<think>…</think>``, chosen by ``--reasoning-parser``.

The reasoning goes to ``reasoning_content``, the rest is the answer's content
(and what a tool-call parser reads, so reasoning comes before any calls).

- ``qwen3``: a ``<think>…</think>`` block at the start of the output (after
  optional whitespace) is the reasoning; without ``<think>`` there, all of it is
  content; a ``<think>`` never closed makes the rest of the output reasoning.
- ``deepseek_r1`` (alias ``deepseek-r1``): the chat template has opened the
  thought already, so the output starts inside it: everything up to ``</think>``
  is reasoning (a leading ``<think>`` is dropped), and with no ``</think>`` at
  all everything is.

The tags are dropped, the newlines right after ``</think>`` too; the reasoning
is kept as written. Empty reasoning counts as none. Streaming holds back only
what may still be a tag (``</thi``; at the start, whitespace and ``<thi``).
"""

from __future__ import annotations

from typing import Protocol

from tandem.gateway.tools.calls import ContentPiece, ReasoningPiece
from tandem.gateway.tools.hermes import partial_tag

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
_WHITESPACE = " \t\n\r"
_NEWLINES = "\r\n"

ReasoningEvent = ReasoningPiece | ContentPiece

_START, _THINK, _AFTER, _CONTENT = range(4)


class ReasoningStreamer(Protocol):
    def push(self, text: str) -> list[ReasoningEvent]: ...

    def finish(self) -> list[ReasoningEvent]: ...


class ReasoningParser(Protocol):
    def parse(self, text: str) -> tuple[str | None, str]:
        """Whole output → (reasoning or None, content)."""
        ...

    def streamer(self) -> ReasoningStreamer: ...


class ThinkStreamer:
    """``<think>`` splitting; ``opened``: the output starts inside the thought (DeepSeek-R1)."""

    def __init__(self, *, opened: bool) -> None:
        self._opened = opened
        self._mode = _START
        self._buf = ""
        self._lead: list[str] = []  # whitespace before anything else
        self._out: list[ReasoningEvent] = []

    def push(self, text: str) -> list[ReasoningEvent]:
        self._buf += text
        self._run(final=False)
        return self._take()

    def finish(self) -> list[ReasoningEvent]:
        self._run(final=True)
        return self._take()

    def _take(self) -> list[ReasoningEvent]:
        out, self._out = self._out, []
        return out

    def _emit(self, event: ReasoningEvent) -> None:
        if event.text:
            self._out.append(event)

    def _run(self, final: bool) -> None:
        while True:
            buf = self._buf
            if self._mode == _START:
                # Leading whitespace waits in a list of its own: a long run costs nothing.
                rest = buf.lstrip(_WHITESPACE)
                self._lead.append(buf[: len(buf) - len(rest)])
                self._buf = rest
                if rest.startswith(THINK_OPEN):
                    self._buf, self._mode = rest[len(THINK_OPEN) :], _THINK
                elif THINK_OPEN.startswith(rest) and not final:
                    return  # whitespace, or "<thi" still coming
                else:
                    self._buf = "".join(self._lead) + rest
                    self._mode = _THINK if self._opened else _CONTENT
                self._lead = []
            elif self._mode == _THINK:
                end = buf.find(THINK_CLOSE)
                if end >= 0:
                    self._emit(ReasoningPiece(buf[:end]))
                    self._buf, self._mode = buf[end + len(THINK_CLOSE) :], _AFTER
                    continue
                keep = 0 if final else partial_tag(buf, THINK_CLOSE)
                self._emit(ReasoningPiece(buf[: len(buf) - keep]))
                self._buf = buf[len(buf) - keep :]
                return
            elif self._mode == _AFTER:
                self._buf = buf.lstrip(_NEWLINES)
                if not self._buf:
                    return
                self._mode = _CONTENT
            else:
                self._emit(ContentPiece(buf))
                self._buf = ""
                return


class Qwen3ReasoningParser:
    opened = False

    def parse(self, text: str) -> tuple[str | None, str]:
        streamer = self.streamer()
        reasoning: list[str] = []
        content: list[str] = []
        for event in streamer.push(text) + streamer.finish():
            (reasoning if isinstance(event, ReasoningPiece) else content).append(event.text)
        return ("".join(reasoning) or None), "".join(content)

    def streamer(self) -> ThinkStreamer:
        return ThinkStreamer(opened=self.opened)


class DeepSeekR1ReasoningParser(Qwen3ReasoningParser):
    opened = True


REASONING_PARSERS: dict[str, type] = {
    "qwen3": Qwen3ReasoningParser,
    "deepseek_r1": DeepSeekR1ReasoningParser,
    "deepseek-r1": DeepSeekR1ReasoningParser,
}


def reasoning_parser(name: str) -> ReasoningParser:
    """The parser registered as ``name``; ValueError naming the known ones otherwise."""
    try:
        parser_class = REASONING_PARSERS[name]
    except KeyError:
        known = ", ".join(sorted(REASONING_PARSERS))
        raise ValueError(f"unknown reasoning parser {name!r} (known: {known})") from None
    parser: ReasoningParser = parser_class()
    return parser
