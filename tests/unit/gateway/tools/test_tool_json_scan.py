"""ValueScanner: incremental JSON validation agrees with a strict JSON parser, in any pieces."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tools_testing import split

from tandem.gateway.tools.json_scan import Scan, ValueScanner

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
# Characters that make JSON interesting: structure, escapes, number parts, controls, unicode.
JSONISH = st.text(alphabet=list('{}[]":,\\ \n\t-+.eE0123456789truefalsn u/bx\x01é😀'), max_size=40)


def _reject(name: str) -> Any:
    raise ValueError(name)


def strictly_valid(text: str) -> bool:
    try:
        json.loads(text, parse_constant=_reject)
    except (ValueError, RecursionError):
        return False
    return True


def scan_all(pieces: list[str]) -> tuple[int, Scan]:
    """Feed pieces until the scanner stops; (offset in the joined text, status)."""
    scanner, offset = ValueScanner(), 0
    for piece in pieces:
        end, status = scanner.scan(piece, 0)
        if status is not Scan.MORE:
            return offset + end, status
        offset += len(piece)
    return offset, Scan.MORE


def verdict(text: str) -> bool:
    """The scanner's answer to 'is text one JSON value?' (a space lets a number end)."""
    end, status = scan_all([text + " "])
    return status is Scan.DONE and not text[end:].strip(" \t\n\r")


@pytest.mark.fuzz
@settings(max_examples=300, deadline=None)
@given(
    value=JSON_VALUES,
    indent=st.sampled_from([None, 0, 2]),
    ascii_only=st.booleans(),
    cuts=st.lists(st.integers(0, 10_000), max_size=6),
)
def test_valid_json_is_accepted_and_ends_where_it_ends(
    value: Any, indent: int | None, ascii_only: bool, cuts: list[int]
) -> None:
    text = json.dumps(value, indent=indent, ensure_ascii=ascii_only)
    assert verdict(text)
    if isinstance(value, dict | list | str | bool) or value is None:
        # Containers, strings and literals end on their last character, in any pieces.
        assert scan_all([*split(text, cuts), "trailing"]) == (len(text), Scan.DONE)
    for cut in range(len(text)):  # every proper prefix can still become the value
        assert scan_all([text[:cut]])[1] is not Scan.ERROR


@settings(max_examples=500, deadline=None)
@given(text=JSONISH, cuts=st.lists(st.integers(0, 100), max_size=4))
def test_agrees_with_a_strict_parser_and_ignores_splits(text: str, cuts: list[int]) -> None:
    assert verdict(text) == strictly_valid(text)
    assert scan_all([*split(text, cuts), " "]) == scan_all([text + " "])


@settings(max_examples=300, deadline=None)
@given(
    value=JSON_VALUES,
    at=st.integers(0, 10_000),
    drop=st.integers(0, 2),
    insert=st.sampled_from(["", ",", "]", "}", '"', "\\", ":", "0", "-", "e", ".", " ", "\x02"]),
)
def test_agrees_with_a_strict_parser_on_damaged_json(
    value: Any, at: int, drop: int, insert: str
) -> None:
    text = json.dumps(value)
    at %= len(text) + 1
    damaged = text[:at] + insert + text[at + drop :]
    assert verdict(damaged) == strictly_valid(damaged)


@pytest.mark.parametrize(
    "text",
    [
        "01",
        "-",
        "1.",
        "1e",
        "1e+",
        ".5",
        "+1",
        "[1,]",
        '{"a":1,}',
        '{"a" 1}',
        "{1: 2}",
        "NaN",
        "Infinity",
        "tru",
        "nul",
        '"\\x"',
        '"\\u12G4"',
        '"a\nb"',
        '"\x01"',
        "[1 2]",
        "{}}",
        "'a'",
    ],
)
def test_invalid_json_is_refused(text: str) -> None:
    assert not verdict(text)
    assert not strictly_valid(text)


def test_error_points_at_the_offending_character() -> None:
    assert scan_all(['{"a": [1, 2', "x]}"]) == (11, Scan.ERROR)
    assert scan_all(['{"a": 01}']) == (7, Scan.ERROR)


def test_braces_and_quotes_inside_strings_do_not_end_the_value() -> None:
    text = '{"a": "} ] \\" </tool_call> {", "b": ["]"]}'
    assert scan_all([text + "tail"]) == (len(text), Scan.DONE)


def test_a_number_ends_at_the_next_character_only() -> None:
    assert scan_all(["-12.5e3"]) == (7, Scan.MORE)
    assert scan_all(["-12.5e3", ","]) == (7, Scan.DONE)


def test_deep_nesting_neither_recurses_nor_fails() -> None:
    text = "[" * 100_000
    assert scan_all([text]) == (len(text), Scan.MORE)
    closed = text + "]" * 100_000
    assert scan_all([closed]) == (len(closed), Scan.DONE)


def test_scanning_after_the_end_is_an_error_not_a_crash() -> None:
    scanner = ValueScanner()
    assert scanner.scan("1 ", 0) == (1, Scan.DONE)
    assert scanner.scan("2", 0) == (0, Scan.ERROR)
    assert scanner.scan("]", 0) == (0, Scan.ERROR)
