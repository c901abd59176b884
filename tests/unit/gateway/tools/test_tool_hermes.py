"""The Hermes / Qwen ``<tool_call>`` format: whole outputs and streams, good and broken."""

from __future__ import annotations

import json

import pytest
from tools_testing import calls_of, check_well_formed, run, shape, streamed

from tandem.gateway.tools import (
    ArgumentsPiece,
    CallStart,
    ContentPiece,
    HermesParser,
    HermesStreamer,
)

PARSER = HermesParser()


def call(name: str, arguments: str, key: str = "arguments") -> str:
    return f'<tool_call>\n{{"name": "{name}", "{key}": {arguments}}}\n</tool_call>'


def parsed(text: str) -> tuple[str, list[tuple[str, str]]]:
    content, calls = PARSER.parse(text)
    return content, calls_of(calls)


def by_char(text: str) -> tuple[str, list[tuple[str, str]]]:
    return streamed(HermesStreamer(), list(text))


@pytest.mark.parametrize(
    "text",
    ["", "Hello", "Hello\n\n", "  a < b and c<tool> d  ", "<tool_call", "x </tool_call> y", "\n"],
)
def test_output_without_calls_is_content_unchanged(text: str) -> None:
    assert parsed(text) == (text, [])
    assert by_char(text) == (text, [])


def test_one_call_after_content() -> None:
    text = "Let me check.\n\n" + call("get_weather", '{"city": "Paris"}')
    assert parsed(text) == ("Let me check.", [("get_weather", '{"city": "Paris"}')])
    assert by_char(text) == parsed(text)


def test_calls_in_a_row_leave_no_content() -> None:
    text = call("a", "{}") + "\n" + call("b", '{"x": 1}') + "\n"
    assert parsed(text) == ("", [("a", "{}"), ("b", '{"x": 1}')])
    assert by_char(text) == parsed(text)


def test_whitespace_between_content_and_calls() -> None:
    # Whitespace that only separates calls goes; one separator between content parts stays.
    text = "A\n" + call("f", "{}") + "\nB\n" + call("g", "{}") + "\n\n"
    assert parsed(text) == ("A\nB", [("f", "{}"), ("g", "{}")])
    text = call("f", "{}") + "\n\nDone."
    assert parsed(text) == ("Done.", [("f", "{}")])
    assert by_char(text) == parsed(text)


def test_arguments_are_kept_as_written_but_trimmed() -> None:
    arguments = '{ "a" :1,\n  "b": [1, 2.50e1, {"c": null}], "é": "😀\\u00e9" }'
    text = f'<tool_call>{{"name": "f", "arguments":   {arguments}   }}</tool_call>'
    assert parsed(text) == ("", [("f", arguments)])
    assert json.loads(arguments)["é"] == "😀é"
    assert by_char(text) == parsed(text)


@pytest.mark.parametrize(
    ("body", "arguments"),
    [
        ('{"name": "f", "parameters": {"q": 1}}', '{"q": 1}'),
        ('{"name": "f"}', "{}"),
        ('{"name": "f", "arguments": null}', "{}"),
        ('{"name": "f", "arguments": "{\\"q\\": [1, \\"}\\"]}"}', '{"q": [1, "}"]}'),
        ('{"name": "f", "arguments": " "}', "{}"),
        ('{"arguments": {"q": 1}, "name": "f"}', '{"q": 1}'),
        ('{"type": "function", "name": " f ", "arguments": {}, "id": [1]}', "{}"),
        (
            '{"name": "f", "arguments": {"s": "</tool_call> <tool_call> {"}}',
            '{"s": "</tool_call> <tool_call> {"}',
        ),
        ('{"name": "f", "arguments": {"s": "\\"}\\\\"}}', '{"s": "\\"}\\\\"}'),
        ('{"name": "f\\u00e9", "arguments": {}}', "{}"),
    ],
)
def test_accepted_call_objects(body: str, arguments: str) -> None:
    text = f"<tool_call>{body}</tool_call>"
    content, calls = parsed(text)
    assert content == ""
    assert [a for _, a in calls] == [arguments]
    assert calls[0][0] in ("f", "fé")
    assert by_char(text) == parsed(text)


@pytest.mark.parametrize(
    "body",
    [
        '{"arguments": {}}',  # no name
        '{"name": "", "arguments": {}}',
        '{"name": "  ", "arguments": {}}',
        '{"name": 3, "arguments": {}}',
        '{"name": "f", "name": "g"}',
        '{"name": "f", "arguments": [1]}',
        '{"name": "f", "arguments": 2}',
        '{"name": "f", "arguments": "not json"}',
        '{"name": "f", "arguments": "[1]"}',
        '{"name": "f", "arguments": "{\\"x\\": NaN}"}',
        '{"name": "f", "arguments": {}, "parameters": {}}',
        '{"name": "f\\u0000"}',
        '{"name": "f", "arguments": {"a": 1,}}',
        "[]",
        "not json",
        "",
        '{"name": "f" "arguments": {}}',
    ],
)
def test_malformed_calls_are_content(body: str) -> None:
    text = f"Before <tool_call>{body}</tool_call> after"
    assert parsed(text) == (text, [])


def test_a_broken_call_does_not_hide_the_next_one() -> None:
    text = 'x <tool_call>{"name": 1}</tool_call>\n' + call("g", '{"k": "v"}')
    content, calls = parsed(text)
    assert content == 'x <tool_call>{"name": 1}</tool_call>'
    assert calls == [("g", '{"k": "v"}')]
    assert by_char(text) == parsed(text)


def test_closing_tag_may_be_missing_or_cut_off() -> None:
    one = '<tool_call>{"name": "f", "arguments": {}}'
    assert parsed(one) == ("", [("f", "{}")])
    assert parsed(one + "\n</tool_") == ("", [("f", "{}")])
    two = one + "\n" + one + " and more"
    assert parsed(two) == ("and more", [("f", "{}"), ("f", "{}")])
    assert by_char(two) == parsed(two)


def test_a_half_finished_call_is_content_in_the_whole_answer() -> None:
    text = 'Sure: <tool_call>{"name": "f", "arguments": {"a": "x</tool_call>'
    assert parsed(text) == (text, [])


def test_a_half_finished_call_streamed_keeps_what_went_out() -> None:
    streamer = HermesStreamer()
    events = run(streamer, ['Sure: <tool_call>{"name": "f", ', '"arguments": {"a": 1', ", "])
    check_well_formed(events)
    assert streamer.degraded
    assert shape(events) == [
        ContentPiece("Sure:"),
        CallStart(0, "id0", "f"),
        ArgumentsPiece(0, '{"a": 1, '),
    ]


def test_a_call_broken_after_its_start_streams_the_rest_as_content() -> None:
    streamer = HermesStreamer()
    text = '<tool_call>{"name": "f", "arguments": {"a": 1}, "x": tru}</tool_call>'
    events = run(streamer, [text])
    assert streamer.degraded
    assert shape(events) == [
        CallStart(0, "id0", "f"),
        ArgumentsPiece(0, '{"a": 1}'),
        ContentPiece(', "x": tru}</tool_call>'),
    ]
    assert parsed(text) == (text, [])


def test_streaming_holds_back_only_a_possible_call_start() -> None:
    streamer = HermesStreamer()
    assert streamer.push("Hello wor") == [ContentPiece("Hello wor")]
    assert streamer.push("ld <tool") == [ContentPiece("ld")]
    assert streamer.push("_ca") == []
    assert streamer.push("lx!") == [ContentPiece(" <tool_calx!")]
    assert streamer.push("\n\n") == []
    assert streamer.finish() == [ContentPiece("\n\n")]


def test_streaming_starts_the_call_when_the_name_is_complete() -> None:
    streamer = HermesStreamer()
    assert streamer.push('Ok.\n<tool_call>\n{"name": "get_wea') == [ContentPiece("Ok.")]
    (start,) = streamer.push('ther", "arguments": ')
    assert isinstance(start, CallStart) and start.name == "get_weather" and start.index == 0
    assert streamer.push('{"city": "Pa') == [ArgumentsPiece(0, '{"city": "Pa')]
    assert streamer.push('ris"}') == [ArgumentsPiece(0, 'ris"}')]
    assert streamer.push("}\n</tool_call>") == []
    assert streamer.finish() == []
    assert not streamer.degraded


def test_arguments_before_the_name_follow_the_start() -> None:
    streamer = HermesStreamer()
    assert streamer.push('<tool_call>{"arguments": {"a": [1, 2]}, ') == []
    events = streamer.push('"name": "f"}</tool_call>')
    assert shape(events) == [CallStart(0, "id0", "f"), ArgumentsPiece(0, '{"a": [1, 2]}')]


def test_deep_or_huge_input_does_not_fail() -> None:
    text = "<tool_call>" + '{"name": "f", "arguments": ' + "[" * 50_000
    assert parsed(text) == (text, [])
    big = '{"s": "' + "x" * 200_000 + '"}'
    text = f'<tool_call>{{"name": "f", "arguments": {big}}}</tool_call>'
    assert parsed(text) == ("", [("f", big)])
    assert streamed(HermesStreamer(), [text[i : i + 7] for i in range(0, len(text), 7)]) == (
        "",
        [("f", big)],
    )
