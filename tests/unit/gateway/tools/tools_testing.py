"""Helpers for the parser tests: run a streamer over pieces, compare events without ids."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import pairwise
from typing import Any

from tandem.gateway.tools import (
    ArgumentsPiece,
    CallStart,
    ContentPiece,
    ReasoningPiece,
    ToolCall,
    coalesce,
    collect,
)


def run(streamer: Any, pieces: Iterable[str]) -> list[Any]:
    """Push every piece, then finish; all events in order."""
    events: list[Any] = []
    for piece in pieces:
        events += streamer.push(piece)
    return events + streamer.finish()


def split(text: str, cuts: Iterable[int]) -> list[str]:
    """``text`` cut at the given offsets (any ints; taken modulo the length, sorted)."""
    points = sorted({cut % (len(text) + 1) for cut in cuts} | {0, len(text)})
    return [text[a:b] for a, b in pairwise(points)]


def shape(events: Sequence[Any]) -> list[Any]:
    """Coalesced events with call ids replaced by their order: comparable across runs."""
    ids: dict[str, str] = {}
    out: list[Any] = []
    for event in coalesce(events):
        if isinstance(event, CallStart):
            event = CallStart(event.index, ids.setdefault(event.id, f"id{len(ids)}"), event.name)
        out.append(event)
    return out


def calls_of(calls: Sequence[ToolCall]) -> list[tuple[str, str]]:
    return [(call.name, call.arguments) for call in calls]


def streamed(streamer: Any, pieces: Iterable[str]) -> tuple[str, list[tuple[str, str]]]:
    """What a client reassembles from the stream: (content, [(name, arguments)])."""
    content, calls = collect(run(streamer, pieces))
    return content, calls_of(calls)


def check_well_formed(events: Sequence[Any]) -> None:
    """Indexes count up from 0, pieces belong to the latest call, no empty pieces, ids fresh."""
    started = -1
    ids = set()
    for event in events:
        if isinstance(event, CallStart):
            assert event.index == started + 1
            started = event.index
            assert event.name and event.name == event.name.strip()
            assert event.id.startswith("call_") and len(event.id) == 29
            assert event.id not in ids
            ids.add(event.id)
        elif isinstance(event, ArgumentsPiece):
            assert event.index == started >= 0
            assert event.text
        else:
            assert isinstance(event, ContentPiece | ReasoningPiece)
            assert event.text
