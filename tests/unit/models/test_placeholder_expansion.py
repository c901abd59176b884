"""Anchor → image token run expansion and its ranges."""

from __future__ import annotations

import pytest

from tandem.models import PlaceholderCountError, expand_placeholders

ANCHOR = 900
IMAGE = 901


def test_expands_each_anchor_in_order() -> None:
    ids = [1, ANCHOR, 2, 3, ANCHOR, 4]
    expanded, ranges = expand_placeholders(ids, ANCHOR, [3, 2], IMAGE)
    assert expanded == [1, IMAGE, IMAGE, IMAGE, 2, 3, IMAGE, IMAGE, 4]
    assert ranges == [(1, 3), (6, 2)]
    for offset, length in ranges:
        assert expanded[offset : offset + length] == [IMAGE] * length


def test_anchor_equal_to_image_token() -> None:
    expanded, ranges = expand_placeholders([ANCHOR, 5], ANCHOR, [4], ANCHOR)
    assert expanded == [ANCHOR] * 4 + [5]
    assert ranges == [(0, 4)]


def test_adjacent_anchors() -> None:
    expanded, ranges = expand_placeholders([ANCHOR, ANCHOR], ANCHOR, [2, 1], IMAGE)
    assert expanded == [IMAGE] * 3
    assert ranges == [(0, 2), (2, 1)]


def test_text_only_is_unchanged() -> None:
    assert expand_placeholders([1, 2, 3], ANCHOR, [], IMAGE) == ([1, 2, 3], [])


@pytest.mark.parametrize(("ids", "counts"), [([1, ANCHOR], []), ([1, 2], [4]), ([ANCHOR], [1, 1])])
def test_anchor_and_image_counts_must_match(ids: list[int], counts: list[int]) -> None:
    with pytest.raises(PlaceholderCountError, match="placeholder"):
        expand_placeholders(ids, ANCHOR, counts, IMAGE)


def test_mismatch_is_a_value_error() -> None:
    assert issubclass(PlaceholderCountError, ValueError)


def test_empty_image_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        expand_placeholders([ANCHOR], ANCHOR, [0], IMAGE)
