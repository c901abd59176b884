"""Whole numbers from untrusted text: ASCII digits only, never an exception."""

from __future__ import annotations

import pytest

from tandem.ascii_int import ascii_int


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", 0),
        ("42", 42),
        ("007", 7),
        ("²", None),
        ("١٢", None),
        ("", None),
        (None, None),
        ("-1", None),
        ("+1", None),
        (" 1", None),
        ("1.0", None),
    ],
)
def test_ascii_int(text: str | None, value: int | None) -> None:
    assert ascii_int(text) == value
