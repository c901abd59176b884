"""StopMatcher: hold back possible stop prefixes, cut at the first completed stop."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from tandem.gateway.stops import StopMatcher, StopResult


def run(stops: list[str], deltas: list[str]) -> tuple[list[str], StopMatcher]:
    """Feed deltas until a stop; return each emitted piece (flush last when not stopped)."""
    matcher = StopMatcher(stops)
    pieces = []
    for delta in deltas:
        result = matcher.push(delta)
        pieces.append(result.text)
        if result.stopped:
            return pieces, matcher
    pieces.append(matcher.flush())
    return pieces, matcher


def reference(text: str, stops: list[str]) -> tuple[str, str | None]:
    """Oracle: cut before the stop occurrence that ends first (longest on a tie)."""
    for end in range(1, len(text) + 1):
        for stop in sorted((s for s in stops if s), key=len, reverse=True):
            if text[:end].endswith(stop):
                return text[: end - len(stop)], stop
    return text, None


def test_no_stops_passes_everything_through() -> None:
    matcher = StopMatcher([])
    assert matcher.push("abc") == StopResult("abc")
    assert matcher.flush() == ""


def test_stop_inside_one_delta() -> None:
    matcher = StopMatcher(["END"])
    assert matcher.push("hello END world") == StopResult("hello ", stopped=True, stop="END")
    assert matcher.stopped and matcher.matched == "END"
    assert matcher.push("more") == StopResult("")
    assert matcher.flush() == ""


def test_stop_spanning_several_deltas() -> None:
    pieces, matcher = run(["</answer>"], ["42 </", "ans", "wer", "> trailing"])
    assert pieces == ["42 ", "", "", ""]
    assert matcher.matched == "</answer>"


def test_partial_match_that_is_not_a_stop_is_released() -> None:
    matcher = StopMatcher(["STOP"])
    assert matcher.push("a ST") == StopResult("a ")
    assert matcher.push("O") == StopResult("")
    assert matcher.push("RY") == StopResult("STORY")
    assert matcher.push("S") == StopResult("")
    assert matcher.flush() == "S"  # end of output: a held prefix is ordinary text


def test_held_text_restarts_a_new_match() -> None:
    # "aab": the first "a" is not the start of "ab", the second is.
    pieces, matcher = run(["ab"], ["a", "a", "b"])
    assert pieces == ["", "a", ""]
    assert matcher.matched == "ab"


def test_overlapping_stops_first_to_end_wins() -> None:
    # "bc" completes before "abcd" could: generation would have stopped there.
    pieces, matcher = run(["abcd", "bc"], ["a", "b", "c", "d"])
    assert "".join(pieces) == "a"
    assert matcher.matched == "bc"
    pieces, matcher = run(["abcd", "bc"], ["abcd"])
    assert "".join(pieces) == "a" and matcher.matched == "bc"


def test_overlapping_stops_same_end_longest_wins() -> None:
    pieces, matcher = run(["b", "ab"], ["xab"])
    assert "".join(pieces) == "x"
    assert matcher.matched == "ab"


def test_empty_and_duplicate_stops_are_ignored() -> None:
    matcher = StopMatcher(["", "x", "x"])
    assert matcher.stops == ("x",)
    assert matcher.push("abc") == StopResult("abc")


def test_multibyte_stop() -> None:
    pieces, matcher = run(["。\n"], ["你好", "。", "\n再见"])
    assert "".join(pieces) == "你好" and matcher.matched == "。\n"


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet="abc.", max_size=40),
    stops=st.lists(st.text(alphabet="abc.", min_size=1, max_size=4), min_size=1, max_size=4),
    cuts=st.lists(st.integers(0, 40), max_size=8),
)
def test_output_is_text_cut_at_first_stop(text: str, stops: list[str], cuts: list[int]) -> None:
    bounds = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    deltas = [text[a:b] for a, b in pairwise(bounds)]
    pieces, matcher = run(stops, deltas)
    expected, stop = reference(text, stops)
    assert "".join(pieces) == expected
    assert matcher.matched == stop
    assert matcher.stopped == (stop is not None)


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=30), stop=st.text(min_size=1, max_size=3))
def test_text_is_released_as_soon_as_it_cannot_start_a_stop(text: str, stop: str) -> None:
    matcher = StopMatcher([stop])
    emitted = ""
    for i, ch in enumerate(text):
        result = matcher.push(ch)
        emitted += result.text
        if result.stopped:
            return
        seen = text[: i + 1]
        held = seen[len(emitted) :]
        assert seen.startswith(emitted)
        # Whatever is held is a proper prefix of the stop, so only that much waits.
        assert len(held) < len(stop) and stop.startswith(held)
