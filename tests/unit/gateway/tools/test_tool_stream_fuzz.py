"""Properties of every tool-call streamer, on generated, damaged and cut-off outputs.

- any split of an output gives the same events (coalesced) as pushing it whole;
- the events are well formed, and ``parse()`` of the same text agrees with what the
  stream reassembles to, unless a call broke after its start went out (``degraded``),
  when the whole answer only drops that call;
- every call ``parse()`` returns has a name and arguments that are a strict JSON object;
- nothing raises, whatever the text.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tools_testing import calls_of, check_well_formed, run, shape, split

from tandem.gateway.tools import (
    ContentPiece,
    HermesParser,
    JsonParser,
    NamedParser,
    RequiredParser,
    collect,
)
from tandem.gateway.tools.hermes import OPEN_TAG, partial_tag

# Many generated cases each: left out of `make test-unit`, run by `make test`.
pytestmark = pytest.mark.fuzz

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
ARGUMENTS = st.dictionaries(
    st.sampled_from(["a", "city", "é", "}", "</tool_call>", '"']), JSON_VALUES, max_size=3
)
NAMES = st.sampled_from(["f", "get_weather", "é😀", " padded ", "", " ", "a\x00"]) | st.text(
    alphabet="abcxyz_-.", min_size=1, max_size=4
)
WS = st.sampled_from(["", " ", "\n", "\n\n", "\t "])
JUNK = st.sampled_from(
    ["<tool_call>", "</tool_call>", "<tool_", "</tool", "<", "{", "}", "[", "]", '"', "\\", ",",
     ":", '"name"', '"arguments"', "null", "1", " ", "\n", "é", "😀", "Sure.", "</think>"]
) | st.text(max_size=4)  # fmt: skip


def dump(value: Any, draw: Callable[..., Any]) -> str:
    indent = draw(st.sampled_from([None, 2]))
    separators = draw(st.sampled_from([(",", ":"), (", ", ": ")]))
    ascii_only = draw(st.booleans())
    return json.dumps(value, indent=indent, separators=separators, ensure_ascii=ascii_only)


@st.composite
def call_object(
    draw: Callable[..., Any], keys: tuple[str, ...] = ("arguments", "parameters")
) -> str:
    arguments = draw(ARGUMENTS)
    fields = [("name", draw(NAMES))]
    style = draw(st.sampled_from(["object", "object", "string", "null", "absent"]))
    key = draw(st.sampled_from(keys))
    if style == "object":
        fields.append((key, arguments))
    elif style == "string":
        fields.append((key, json.dumps(arguments)))
    elif style == "null":
        fields.append((key, None))
    if draw(st.booleans()):
        fields.reverse()
    if draw(st.integers(0, 4)) == 0:
        fields.insert(draw(st.integers(0, len(fields))), ("type", draw(JSON_VALUES)))
    body = ("," + draw(WS)).join(f"{json.dumps(k)}: {dump(v, draw)}" for k, v in fields)
    return "{" + draw(WS) + body + draw(WS) + "}"


@st.composite
def damaged(draw: Callable[..., Any], text: str) -> str:
    """Maybe cut the text off, and maybe break one character of it."""
    if text and draw(st.integers(0, 3)) == 0:
        at = draw(st.integers(0, len(text) - 1))
        text = text[:at] + draw(JUNK) + text[at + draw(st.integers(0, 2)) :]
    if text and draw(st.integers(0, 3)) == 0:
        text = text[: draw(st.integers(0, len(text)))]
    return text


@st.composite
def hermes_outputs(draw: Callable[..., Any]) -> str:
    parts = []
    for _ in range(draw(st.integers(0, 4))):
        if draw(st.booleans()):
            close = draw(st.sampled_from(["</tool_call>", "</tool_call>", ""]))
            parts.append(draw(WS) + OPEN_TAG + draw(WS) + draw(call_object()) + draw(WS) + close)
        else:
            parts.append(draw(JUNK))
    return draw(damaged("".join(parts)))


@st.composite
def json_outputs(draw: Callable[..., Any], keys: tuple[str, ...], arrays: bool) -> str:
    objects = [draw(call_object(keys)) for _ in range(draw(st.integers(0, 3)))]
    if arrays or draw(st.booleans()):
        value = "[" + ("," + draw(WS)).join(objects) + "]"
    else:
        value = objects[0] if objects else draw(JUNK)
    tail = draw(st.sampled_from(["", "", "\n", " And more.", "]"]))
    return draw(damaged(draw(WS) + value + tail))


@st.composite
def named_outputs(draw: Callable[..., Any]) -> str:
    return draw(damaged(draw(WS) + dump(draw(ARGUMENTS), draw) + draw(WS)))


def _is_subsequence(small: list[Any], big: list[Any]) -> bool:
    rest = iter(big)
    return all(any(x == y for y in rest) for x in small)


def check(parser: Any, text: str, cuts: list[int]) -> None:
    whole_streamer, split_streamer = parser.streamer(), parser.streamer()
    whole = run(whole_streamer, [text])
    pieces = run(split_streamer, split(text, cuts))
    check_well_formed(pieces)
    assert shape(pieces) == shape(whole)
    assert split_streamer.degraded == whole_streamer.degraded
    if len(text) < 120:
        assert shape(run(parser.streamer(), list(text))) == shape(whole)

    content, calls = parser.parse(text)
    for call in calls:
        assert call.name and call.name == call.name.strip()
        assert isinstance(json.loads(call.arguments), dict)
        assert call.arguments == call.arguments.strip()
    stream_content, stream_calls = collect(pieces)
    if split_streamer.degraded:
        assert _is_subsequence(calls_of(calls), calls_of(stream_calls))
    else:
        assert (stream_content, calls_of(stream_calls)) == (content, calls_of(calls))
    if not calls:
        assert content == text or content == text.strip()


CUTS = st.lists(st.integers(0, 10_000), max_size=10)


@settings(max_examples=600, deadline=None)
@given(text=hermes_outputs(), cuts=CUTS)
def test_hermes(text: str, cuts: list[int]) -> None:
    check(HermesParser(), text, cuts)


@settings(max_examples=400, deadline=None)
@given(text=json_outputs(("arguments", "parameters"), arrays=False), cuts=CUTS)
def test_json(text: str, cuts: list[int]) -> None:
    check(JsonParser(), text, cuts)


@settings(max_examples=300, deadline=None)
@given(text=json_outputs(("parameters",), arrays=True), cuts=CUTS)
def test_required(text: str, cuts: list[int]) -> None:
    check(RequiredParser(), text, cuts)


@settings(max_examples=300, deadline=None)
@given(text=named_outputs(), cuts=CUTS)
def test_named(text: str, cuts: list[int]) -> None:
    check(NamedParser("f"), text, cuts)


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=60) | st.lists(JUNK, max_size=12).map("".join), cuts=CUTS)
def test_any_text_at_all(text: str, cuts: list[int]) -> None:
    for parser in (HermesParser(), JsonParser(), RequiredParser(), NamedParser("f")):
        check(parser, text, cuts)


@settings(max_examples=300, deadline=None)
@given(text=st.lists(JUNK.filter(lambda s: OPEN_TAG not in s), max_size=10).map("".join))
def test_hermes_releases_content_at_once(text: str) -> None:
    """Without a call tag, one push releases all but whitespace and a partial tag at the end."""
    if OPEN_TAG in text:
        return
    held = text[: len(text) - partial_tag(text, OPEN_TAG)].rstrip(" \t\n\r")
    events = HermesParser().streamer().push(text)
    assert "".join(e.text for e in events if isinstance(e, ContentPiece)) == held
