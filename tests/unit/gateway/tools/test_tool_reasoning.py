"""Reasoning parsers: ``<think>…</think>`` for Qwen3 and DeepSeek-R1, whole and streamed."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tools_testing import check_well_formed, run, split

from tandem.gateway.reasoning import REASONING_PARSERS, reasoning_parser
from tandem.gateway.tools import ContentPiece, ReasoningPiece, coalesce


def parse(name: str, text: str) -> tuple[str | None, str]:
    return reasoning_parser(name).parse(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>\nLet me see.\n</think>\n\nIt is 4.", ("\nLet me see.\n", "It is 4.")),
        ("  \n<think>a</think>b", ("a", "b")),
        ("It is 4.", (None, "It is 4.")),
        ("  It is 4.\n", (None, "  It is 4.\n")),
        ("Answer <think>x</think> y", (None, "Answer <think>x</think> y")),
        ("<think>still thinking", ("still thinking", "")),
        ("<think>cut at </thi", ("cut at </thi", "")),
        ("<think></think>\n\nHi", (None, "Hi")),
        ("<think>é 😀</think>\r\n\n  indented", ("é 😀", "  indented")),
        ("<think>a</think>b</think>c", ("a", "b</think>c")),
        ("", (None, "")),
        ("<thi", (None, "<thi")),
    ],
)
def test_qwen3(text: str, expected: tuple[str | None, str]) -> None:
    assert parse("qwen3", text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Let me see.\n</think>\n\nIt is 4.", ("Let me see.\n", "It is 4.")),
        ("<think>\nhm</think>ok", ("\nhm", "ok")),
        ("no end tag at all", ("no end tag at all", "")),
        ("</think>straight", (None, "straight")),
        ("  <think>x</think>y", ("x", "y")),
        ("  x</think>y", ("  x", "y")),
        ("", (None, "")),
    ],
)
def test_deepseek_r1(text: str, expected: tuple[str | None, str]) -> None:
    assert parse("deepseek_r1", text) == expected
    assert parse("deepseek-r1", text) == expected


def test_streaming_holds_back_only_a_partial_tag() -> None:
    streamer = reasoning_parser("qwen3").streamer()
    assert streamer.push(" <thi") == []
    assert streamer.push("nk>Hmm, 2") == [ReasoningPiece("Hmm, 2")]
    assert streamer.push(" + 2 </thi") == [ReasoningPiece(" + 2 ")]
    assert streamer.push("s is not it") == [ReasoningPiece("</this is not it")]
    assert streamer.push("</think>\n") == []
    assert streamer.push("\n4") == [ContentPiece("4")]
    assert streamer.push(" <think>") == [ContentPiece(" <think>")]
    assert streamer.finish() == []
    streamer = reasoning_parser("qwen3").streamer()
    assert streamer.push("Plain") == [ContentPiece("Plain")]
    streamer = reasoning_parser("deepseek_r1").streamer()
    assert streamer.push("x <") == [ReasoningPiece("x ")]
    assert streamer.finish() == [ReasoningPiece("<")]


def test_unknown_names_are_refused() -> None:
    with pytest.raises(ValueError, match="deepseek_r1, qwen3"):
        reasoning_parser("nope")
    assert {"qwen3", "deepseek_r1", "deepseek-r1"} <= set(REASONING_PARSERS)


FRAGMENTS = [
    "<think>",
    "</think>",
    "<thi",
    "</th",
    "<",
    ">",
    "\n",
    "\r\n",
    " ",
    "a",
    "é😀",
    "think",
]


@settings(max_examples=400, deadline=None)
@given(
    name=st.sampled_from(["qwen3", "deepseek_r1"]),
    parts=st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=3), max_size=14),
    cuts=st.lists(st.integers(0, 200), max_size=8),
)
def test_any_split_streams_the_same_and_agrees_with_parse(
    name: str, parts: list[str], cuts: list[int]
) -> None:
    text = "".join(parts)
    parser = reasoning_parser(name)
    whole = run(parser.streamer(), [text])
    pieces = run(parser.streamer(), split(text, cuts))
    check_well_formed(pieces)
    assert coalesce(pieces) == coalesce(whole)
    reasoning = "".join(e.text for e in pieces if isinstance(e, ReasoningPiece))
    content = "".join(e.text for e in pieces if isinstance(e, ContentPiece))
    assert parser.parse(text) == (reasoning or None, content)
    # Reasoning first, then content: they never interleave.
    kinds = [type(e) for e in coalesce(pieces)]
    assert kinds in ([], [ReasoningPiece], [ContentPiece], [ReasoningPiece, ContentPiece])
