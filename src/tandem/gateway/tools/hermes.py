"""The Hermes / Qwen tool-call format: ``<tool_call>{"name": …, "arguments": …}</tool_call>``.

Qwen3-VL's chat template teaches this format (its ``<tools>`` section).
A call is the tag, a JSON call object (any whitespace around it) and the closing
tag; several may follow each other, with content before, between and after.

Content is the text outside the calls, minus the whitespace that only separated
them: whitespace right before a call is dropped, and whitespace right after one
is dropped unless content follows that had content before the call too, so
``"Sure.\\n<tool_call>…</tool_call>"`` gives ``"Sure."`` and ``"A\\n<tool_call>…
</tool_call>\\nB"`` gives ``"A\\nB"``.

Leniency, as models write it: the closing tag may be missing (at the end of the
output or before the next call), since the object's closing brace already ends
the call; a half-written closing tag at the very end is dropped with it.

Streaming holds back only a tail that may still become a call (whitespace and a
partial ``<tool_call>``) and, inside a call, what no event can stand for yet. A
call that breaks (bad JSON, no name, cut off) degrades to content: before its
``CallStart`` the client gets all of its raw text as content; after it, the
client keeps the start and the arguments pieces it has, and gets the raw text
that followed them as content (``degraded`` is then true; ``parse()`` of the same
text gives no such call and all of its text as content).
"""

from __future__ import annotations

from tandem.gateway.tools.call_reader import CallReader
from tandem.gateway.tools.calls import ToolCall, collect
from tandem.gateway.tools.json_scan import WHITESPACE, Scan
from tandem.gateway.tools.sink import Sink, SinkStreamer

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"

_TEXT, _CALL, _AFTER_CALL = range(3)


def partial_tag(text: str, tag: str) -> int:
    """Length of the longest end of ``text`` that is a proper beginning of ``tag``."""
    for length in range(min(len(text), len(tag) - 1), 0, -1):
        if text.endswith(tag[:length]):
            return length
    return 0


class HermesStreamer(SinkStreamer):
    def __init__(self, *, whole: bool = False) -> None:
        self._sink = Sink(whole)
        self._mode = _TEXT
        self._buf = ""  # text read but not decided
        # Whitespace held in front of _buf (it may only separate calls); kept apart so that a
        # long run of it costs nothing per push.
        self._ws: list[str] = []
        self._reader: CallReader | None = None
        self._after_call = False  # only whitespace since the last completed call

    def _content(self, text: str) -> None:
        if self._after_call and not self._sink.content_seen:
            text = text.lstrip(WHITESPACE)  # nothing before the calls to keep apart
        if text:
            self._sink.content(text)
            self._after_call = False

    def _run(self, final: bool) -> None:
        while True:
            if self._mode == _CALL:
                assert self._reader is not None
                end, status = self._reader.feed(self._buf)
                self._buf = self._buf[end:]
                if status is Scan.DONE:
                    self._sink.commit()
                    self._mode = _AFTER_CALL
                elif status is Scan.ERROR or final:
                    self._sink.content(self._sink.fail())
                    self._after_call = False
                    self._mode = _TEXT
                else:
                    return
            elif self._mode == _AFTER_CALL:
                rest = self._hold_whitespace()
                if rest.startswith(CLOSE_TAG):
                    self._buf = rest[len(CLOSE_TAG) :]
                    self._ws.clear()
                elif not rest or CLOSE_TAG.startswith(rest):
                    if not final:
                        return  # whitespace, or the closing tag still coming
                    self._buf = ""
                    self._ws.clear()
                self._mode, self._after_call = _TEXT, True
            elif not self._text(final):
                return

    def _hold_whitespace(self) -> str:
        """Move leading whitespace of the buffer to the held run; returns the rest."""
        rest = self._buf.lstrip(WHITESPACE)
        if len(rest) < len(self._buf):
            self._ws.append(self._buf[: len(self._buf) - len(rest)])
            self._buf = rest
        return rest

    def _take_whitespace(self) -> str:
        run = "".join(self._ws)
        self._ws.clear()
        return run

    def _text(self, final: bool) -> bool:
        """Release content up to the next call; True when a call starts."""
        buf = self._buf  # follows the held whitespace run, self._ws
        start = buf.find(OPEN_TAG)
        if start >= 0:
            before = buf[:start]
            body = before.rstrip(WHITESPACE)
            lead = self._take_whitespace()
            if body:
                self._content(lead + body)
                lead = ""
            self._sink.open(lead + before[len(body) :] + OPEN_TAG)
            self._reader = CallReader(self._sink)
            self._buf = buf[start + len(OPEN_TAG) :]
            self._mode = _CALL
            return True
        if final:
            held = self._take_whitespace() + buf
            if not (self._after_call and not held.strip(WHITESPACE)):
                self._content(held)
            self._buf = ""
            return False
        body = buf[: len(buf) - partial_tag(buf, OPEN_TAG)]
        text = body.rstrip(WHITESPACE)
        if text:
            self._content(self._take_whitespace() + text)
        if len(text) < len(body):
            self._ws.append(body[len(text) :])
        self._buf = buf[len(body) :]
        return False


class HermesParser:
    """``hermes`` / ``qwen``: see the module doc."""

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        streamer = HermesStreamer(whole=True)
        events = streamer.push(text) + streamer.finish()
        return collect(events)

    def streamer(self) -> HermesStreamer:
        return HermesStreamer()
