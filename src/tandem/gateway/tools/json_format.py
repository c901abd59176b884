"""Calls written as bare JSON: the ``json`` parser, and ``tool_choice="required"`` output.

``json``: the output (after optional whitespace) is one call object
``{"name": …, "arguments"|"parameters": …}`` or an array of them; anything else
is content. ``required``: the gateway constrained the output to a JSON array of
``{"name": str, "parameters": object}`` (``tandem.gateway.endpoints.common.tool_schemas``), so
only an array is read. Either way the JSON value is read as one unit: text after
it is content (whitespace before that text dropped); an empty array, an element
that is not a call, or a value cut off breaks it. A break degrades to content as
in the Hermes format: ``parse()`` gives no calls and the whole text as content,
a streamer has already sent the calls before the break and sends the raw text
that follows them as content (``degraded``). An array that ``max_tokens`` cut
(``finish(cut=True)``) is not broken but short: the calls begun stand, the last
with the arguments written so far, streamed or not (as for a named call,
``tools/named.py``); cut before any call's name is complete, it is content.

Streaming holds leading whitespace and, once a ``{`` or ``[`` opens the output,
whatever no event can stand for yet; text that cannot start a call is content
at once.
"""

from __future__ import annotations

from tandem.gateway.tools.call_reader import CallReader
from tandem.gateway.tools.calls import Event, ToolCall, collect
from tandem.gateway.tools.json_scan import WHITESPACE, Scan
from tandem.gateway.tools.sink import Sink, SinkStreamer

_START, _OBJECT, _ARRAY, _TAIL, _PASS = range(5)
# Inside an array: after "[", after ",", after an element.
_FIRST, _NEXT, _AFTER = range(3)


class JsonStreamer(SinkStreamer):
    def __init__(self, *, arrays_only: bool = False, whole: bool = False) -> None:
        self._arrays_only = arrays_only
        self._sink = Sink(whole)
        self._mode = _START
        self._where = _FIRST
        self._buf = ""
        self._lead: list[str] = []  # whitespace before anything else
        self._reader: CallReader | None = None
        self._cut = False

    def finish(self, cut: bool = False) -> list[Event]:
        """``cut``: the token limit ended the output; an array begun keeps its calls."""
        self._cut = cut
        return super().finish()

    def _fail(self, ended: bool = False) -> None:
        """The value broke; ``ended``: only because the text ended, not malformed."""
        if ended and self._cut and self._mode == _ARRAY and self._sink.region_calls:
            self._sink.commit()  # cut short: the calls begun stand
        else:
            self._sink.content(self._sink.fail())
        self._reader = None
        self._mode = _PASS

    def _run(self, final: bool) -> None:
        while True:
            mode = self._mode
            if mode == _PASS:
                self._sink.content(self._buf)
                self._buf = ""
                return
            if mode == _TAIL:
                self._buf = self._buf.lstrip(WHITESPACE)
                if not self._buf:
                    return
                self._mode = _PASS
            elif self._reader is not None:
                end, status = self._reader.feed(self._buf)
                self._buf = self._buf[end:]
                if status is Scan.DONE:
                    self._reader = None
                    if mode == _OBJECT:
                        self._sink.commit()
                        self._mode = _TAIL
                    else:
                        self._where = _AFTER
                elif status is Scan.ERROR or final:
                    self._fail(ended=status is not Scan.ERROR)
                else:
                    return
            elif mode == _START:
                # Leading whitespace waits in a list of its own: a long run costs nothing.
                rest = self._buf.lstrip(WHITESPACE)
                self._lead.append(self._buf[: len(self._buf) - len(rest)])
                self._buf = rest
                if not rest and not final:
                    return
                lead = "".join(self._lead)
                self._lead = []
                if rest[:1] == "[":
                    self._sink.open(lead + "[")
                    self._buf, self._mode, self._where = rest[1:], _ARRAY, _FIRST
                elif rest[:1] == "{" and not self._arrays_only:
                    self._sink.open(lead)
                    self._buf, self._mode = rest, _OBJECT
                    self._reader = CallReader(self._sink)
                else:
                    self._buf, self._mode = lead + rest, _PASS  # only whitespace, or not JSON
            elif not self._array(final):
                return

    def _array(self, final: bool) -> bool:
        """Read the array's own syntax up to the next element; False: wait for more text."""
        rest = self._buf.lstrip(WHITESPACE)
        self._sink.raw(self._buf[: len(self._buf) - len(rest)])
        self._buf = rest
        if not rest:
            if final:
                self._fail(ended=True)
                return True
            return False
        c, where = rest[0], self._where
        if c == "{" and where in (_FIRST, _NEXT):
            self._reader = CallReader(self._sink)
            return True
        if where == _AFTER and c in ",]":
            self._sink.raw(c)
            self._buf = rest[1:]
            if c == ",":
                self._where = _NEXT
            else:
                self._sink.commit()
                self._mode = _TAIL
            return True
        if where == _FIRST and c == "]":
            self._sink.raw(c)  # an empty array holds no call: it is content
            self._buf = rest[1:]
        self._fail()
        return True


def _parse(streamer: JsonStreamer, text: str) -> tuple[str, list[ToolCall]]:
    return collect(streamer.push(text) + streamer.finish())


class JsonParser:
    """``json``: see the module doc."""

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        return _parse(JsonStreamer(whole=True), text)

    def streamer(self) -> JsonStreamer:
        return JsonStreamer()


class RequiredStreamer(JsonStreamer):
    """Output forced by ``tool_choice="required"``: an array of ``{"name", "parameters"}``."""

    def __init__(self, *, whole: bool = False) -> None:
        super().__init__(arrays_only=True, whole=whole)


class RequiredParser:
    """``tool_choice="required"`` output as a ToolParser (content is what is not the array)."""

    def parse(self, text: str, cut: bool = False) -> tuple[str, list[ToolCall]]:
        streamer = RequiredStreamer(whole=True)
        return collect(streamer.push(text) + streamer.finish(cut))

    def streamer(self) -> RequiredStreamer:
        return RequiredStreamer()


def parse_required(text: str, cut: bool = False) -> list[ToolCall]:
    """The calls of a ``required`` output; [] when it is not a complete array of calls
    (the caller then answers with the text as content), unless ``cut``: then the calls
    begun, the last with its arguments so far."""
    return RequiredParser().parse(text, cut)[1]
