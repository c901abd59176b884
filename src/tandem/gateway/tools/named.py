"""Output forced by a named ``tool_choice``: the text is that function's arguments object.

The gateway constrained decoding to the function's parameter schema
(``tandem.gateway.endpoints.common.tool_schemas``), so the call's name is known before the
model writes anything: the streamer's first answer (to ``push`` or ``finish``)
starts with the ``CallStart``, and the object's text goes out as
``ArgumentsPiece``s as it arrives (whitespace around it dropped, text after it
content). If the text is not a JSON object, or ends before the object does, the
call breaks after its start: the client keeps the start and any pieces, and gets
the rest as content (``degraded``); ``parse_named`` gives None, the caller answers
with the text as content. Output that ``max_tokens`` cut (``finish(cut=True)``)
is different: the call stands with the arguments written so far, streamed or
not, as OpenAI's and vLLM's servers answer.
"""

from __future__ import annotations

from tandem.gateway.tools.calls import ArgumentsPiece, Event, ToolCall, collect
from tandem.gateway.tools.json_scan import WHITESPACE, Scan, ValueScanner
from tandem.gateway.tools.sink import Sink, SinkStreamer

_LEAD, _OBJECT, _TAIL, _PASS = range(4)


class NamedStreamer(SinkStreamer):
    def __init__(self, name: str, *, whole: bool = False) -> None:
        self._name = name
        self._sink = Sink(whole)
        self._sink.open()
        self._index: int | None = None
        self._mode = _LEAD
        self._scanner = ValueScanner()
        self._buf = ""
        self._cut = False

    def finish(self, cut: bool = False) -> list[Event]:
        """``cut``: the token limit ended the output; a call begun keeps its partial
        arguments instead of breaking."""
        self._cut = cut
        return super().finish()

    def _run(self, final: bool) -> None:
        if self._index is None:
            self._index = self._sink.start_call(self._name)
        while True:
            if self._mode == _PASS:
                self._sink.content(self._buf)
                self._buf = ""
                return
            if self._mode == _TAIL:
                self._buf = self._buf.lstrip(WHITESPACE)
                if not self._buf:
                    return
                self._mode = _PASS
            elif self._mode == _LEAD:
                rest = self._buf.lstrip(WHITESPACE)
                self._sink.raw(self._buf[: len(self._buf) - len(rest)])
                self._buf = rest
                if rest.startswith("{"):
                    self._mode = _OBJECT
                elif rest or final:
                    self._fail()
                else:
                    return
            else:
                end, status = self._scanner.scan(self._buf, 0)
                piece, self._buf = self._buf[:end], self._buf[end:]
                if piece:
                    self._sink.raw(piece)
                    self._sink.event(ArgumentsPiece(self._index, piece))
                if status is Scan.DONE:
                    self._sink.commit()
                    self._mode = _TAIL
                elif status is Scan.ERROR or final:
                    self._fail()
                else:
                    return

    def _fail(self) -> None:
        if self._cut and self._mode == _OBJECT:
            self._sink.commit()  # cut short, not malformed: the partial call stands
        else:
            self._sink.content(self._sink.fail())
        self._mode = _PASS


class NamedParser:
    """A named ``tool_choice`` as a ToolParser: one call, or none and the text as content."""

    def __init__(self, name: str) -> None:
        self.name = name

    def parse(self, text: str, cut: bool = False) -> tuple[str, list[ToolCall]]:
        streamer = NamedStreamer(self.name, whole=True)
        return collect(streamer.push(text) + streamer.finish(cut))

    def streamer(self) -> NamedStreamer:
        return NamedStreamer(self.name)


def parse_named(name: str, text: str, cut: bool = False) -> ToolCall | None:
    """The call a named ``tool_choice`` output makes; None when the text is not a whole
    JSON object (the caller then answers with the text as content), unless ``cut``: then
    the object begun is the call's arguments so far."""
    calls = NamedParser(name).parse(text, cut)[1]
    return calls[0] if calls else None
