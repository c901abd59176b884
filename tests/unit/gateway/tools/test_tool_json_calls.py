"""Bare-JSON calls: the ``json`` parser, and output forced by ``tool_choice`` (required, named)."""

from __future__ import annotations

import pytest
from tools_testing import calls_of, check_well_formed, run, shape, streamed

from tandem.gateway.tools import (
    ArgumentsPiece,
    CallStart,
    ContentPiece,
    JsonParser,
    JsonStreamer,
    NamedStreamer,
    RequiredParser,
    RequiredStreamer,
    parse_named,
    parse_required,
)

PARSER = JsonParser()


def parsed(text: str) -> tuple[str, list[tuple[str, str]]]:
    content, calls = PARSER.parse(text)
    return content, calls_of(calls)


def by_char(streamer: object, text: str) -> tuple[str, list[tuple[str, str]]]:
    return streamed(streamer, list(text))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"name": "f", "arguments": {"a": 1}}', ("", [("f", '{"a": 1}')])),
        ('\n {"name": "f", "parameters": {"a": "}"}}\n', ("", [("f", '{"a": "}"}')])),
        (
            '[{"name": "f", "parameters": {}}, {"name": "g", "arguments": {"b": [2]}}]',
            ("", [("f", "{}"), ("g", '{"b": [2]}')]),
        ),
        ('{"name": "f"}\n\nThat is the call.', ("That is the call.", [("f", "{}")])),
    ],
)
def test_json_calls(text: str, expected: tuple[str, list[tuple[str, str]]]) -> None:
    assert parsed(text) == expected
    assert by_char(JsonStreamer(), text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "  ",
        "The answer is 4.",
        'Call {"name": "f"}',
        '{"answer": 42}',
        "[]",
        "[1, 2]",
        '[{"name": "f"}, 3]',
        '[{"name": "f"},]',
        '{"name": "f", "arguments": {"a": 1}',  # cut off
        '[{"name": "f"}',
        "{not json}",
    ],
)
def test_anything_else_is_content(text: str) -> None:
    assert parsed(text) == (text, [])


def test_plain_text_streams_at_once_and_json_is_held() -> None:
    streamer = JsonStreamer()
    assert streamer.push("  ") == []
    assert streamer.push("Hi") == [ContentPiece("  Hi")]
    assert streamer.push(" {") == [ContentPiece(" {")]
    streamer = JsonStreamer()
    assert streamer.push(' {"answer"') == []
    assert shape(streamer.push(", ")) == [ContentPiece(' {"answer", ')]  # not JSON at ","
    streamer = JsonStreamer()
    assert streamer.push(' {"answer": 1') == []
    assert shape(streamer.push("} more")) == [
        ContentPiece(' {"answer": 1} more')
    ]  # no name: content


def test_json_array_streams_each_call_and_degrades_when_cut() -> None:
    streamer = JsonStreamer()
    events = run(streamer, ['[{"name": "f", "arguments": {"a": 1}}, ', '{"name": "g", "arg'])
    check_well_formed(events)
    assert streamer.degraded
    assert shape(events) == [
        CallStart(0, "id0", "f"),
        ArgumentsPiece(0, '{"a": 1}'),
        CallStart(1, "id1", "g"),
        ContentPiece(', "arg'),
    ]


REQUIRED = (
    '[{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "t", "parameters": {}}]'
)


def test_required_output() -> None:
    calls = parse_required(REQUIRED)
    assert calls_of(calls) == [("get_weather", '{"city": "Paris"}'), ("t", "{}")]
    assert calls[0].id != calls[1].id
    assert by_char(RequiredStreamer(), REQUIRED) == ("", calls_of(calls))
    assert calls_of(RequiredParser().parse(" " + REQUIRED + " ")[1]) == calls_of(calls)


@pytest.mark.parametrize(
    "text", ["", REQUIRED[:-1], REQUIRED[:30], '{"name": "f", "parameters": {}}', "[]", "sorry"]
)
def test_required_output_that_is_not_a_whole_array_gives_no_calls(text: str) -> None:
    assert parse_required(text) == []
    assert RequiredParser().parse(text) == (text, [])


def test_required_streams_calls_as_they_come() -> None:
    streamer = RequiredStreamer()
    assert streamer.push('[{"name": "f"') and streamer.push(', "parameters": {"a"') == [
        ArgumentsPiece(0, '{"a"')
    ]
    assert streamer.push(": 1}}]") == [ArgumentsPiece(0, ": 1}")]
    assert streamer.finish() == []


def test_named_output() -> None:
    call = parse_named("f", ' \n{"a": [1, "}"], "b": {"c": null}}\n')
    assert call is not None
    assert (call.name, call.arguments) == ("f", '{"a": [1, "}"], "b": {"c": null}}')
    assert call.id.startswith("call_")


@pytest.mark.parametrize("text", ["", "  ", '{"a": 1', "[1]", "hello", '{"a": 1,}', '"{}"'])
def test_named_output_that_is_not_an_object_gives_no_call(text: str) -> None:
    assert parse_named("f", text) is None


def test_named_streamer_starts_at_once_and_streams_every_piece() -> None:
    streamer = NamedStreamer("get_weather")
    (start,) = streamer.push("")
    assert isinstance(start, CallStart) and (start.index, start.name) == (0, "get_weather")
    assert streamer.push(' {"ci') == [ArgumentsPiece(0, '{"ci')]
    assert streamer.push('ty": "Paris"}') == [ArgumentsPiece(0, 'ty": "Paris"}')]
    assert streamer.push("\n") == []
    assert streamer.finish() == []
    assert not streamer.degraded


def test_named_streamer_cut_off_or_not_an_object() -> None:
    streamer = NamedStreamer("f")
    events = run(streamer, ['{"a": ', "1"])
    assert streamer.degraded
    assert shape(events) == [CallStart(0, "id0", "f"), ArgumentsPiece(0, '{"a": 1')]
    streamer = NamedStreamer("f")
    assert shape(run(streamer, [" I can't"])) == [
        CallStart(0, "id0", "f"),
        ContentPiece(" I can't"),
    ]
    assert shape(run(NamedStreamer("f"), ['{"a": 1} ok'])) == [
        CallStart(0, "id0", "f"),
        ArgumentsPiece(0, '{"a": 1}'),
        ContentPiece("ok"),
    ]
