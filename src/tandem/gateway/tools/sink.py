"""Where a streamer's events go, and how a call that breaks turns back into content.

A *region* is the stretch of output that a parser reads as calls: one
``<tool_call>…</tool_call>`` for Hermes, the whole JSON value for the JSON
formats. While a region is open the sink also keeps its raw text, so that a
region that turns out malformed can be released as content instead.

Streaming (``whole=False``), events leave at once; the raw text kept is only
what no event has stood for yet (everything after the call's name or the last
arguments piece), and that is what a broken region releases: the client keeps
the call start and arguments pieces it already has, and gets the rest of the
model's text as content. ``degraded`` records that this happened.

For ``parse()`` (``whole=True``), a region's events wait for its end: a region
that completes commits them, one that breaks is dropped and all of its raw text
becomes content, so a whole answer never holds a half call.
"""

from __future__ import annotations

from tandem.gateway.tools.calls import CallStart, ContentPiece, Event, new_call_id


class Sink:
    def __init__(self, whole: bool) -> None:
        self.whole = whole
        self.content_seen = False  # some non-empty content has been emitted
        self.degraded = False  # streaming: a region broke after some of its events left
        self._events: list[Event] = []
        self._region: list[Event] = []  # whole: the open region's events, not yet committed
        self._raw: list[str] = []  # the open region's raw text not yet stood for by an event
        self._calls = 0  # call indexes given out for good
        self._region_calls = 0  # calls started in the open region

    @property
    def region_calls(self) -> int:
        """Calls started in the open region."""
        return self._region_calls

    def take(self) -> list[Event]:
        events, self._events = self._events, []
        return events

    def content(self, text: str) -> None:
        if text:
            self._events.append(ContentPiece(text))
            self.content_seen = True

    def open(self, raw: str = "") -> None:
        """A region starts; ``raw`` is the text read so far that belongs to it."""
        self._region, self._raw, self._region_calls = [], [], 0
        self.raw(raw)

    def raw(self, text: str) -> None:
        if text:
            self._raw.append(text)

    def start_call(self, name: str) -> int:
        """Emit a CallStart with a fresh id; returns the call's index."""
        index = self._calls + self._region_calls
        self._region_calls += 1
        self.event(CallStart(index, new_call_id(), name))
        return index

    def event(self, event: Event) -> None:
        """An event that stands for all of the region's raw text read so far."""
        if self.whole:
            self._region.append(event)
        else:
            self._events.append(event)
            self._raw.clear()

    def commit(self) -> None:
        """The region completed: its events stand, its leftover syntax is dropped."""
        self._events.extend(self._region)
        self._calls += self._region_calls
        self._region, self._raw, self._region_calls = [], [], 0

    def fail(self) -> str:
        """The region broke: drop what can be dropped; returns the raw text to release."""
        text = "".join(self._raw)
        if not self.whole and self._region_calls:
            self._calls += self._region_calls  # those indexes are out already
            self.degraded = True
        self._region, self._raw, self._region_calls = [], [], 0
        return text


class SinkStreamer:
    """The shared frame of the streamers: text is buffered, ``_run`` decides it into the
    sink, and ``push`` / ``finish`` hand over the events decided so far."""

    _sink: Sink
    _buf: str

    @property
    def degraded(self) -> bool:
        """A call broke after its CallStart had been emitted (see each module's doc)."""
        return self._sink.degraded

    def push(self, text: str) -> list[Event]:
        self._buf += text
        self._run(final=False)
        return self._sink.take()

    def finish(self) -> list[Event]:
        self._run(final=True)
        return self._sink.take()

    def _run(self, final: bool) -> None:
        raise NotImplementedError
