"""docs/operations.md's row of refused request fields lists exactly what the gateway
refuses (gateway/endpoints/common/unhonoured.py), and names no field that it honours."""

from __future__ import annotations

import re
from pathlib import Path

from tests.unit.test_readme import _request_field_rows

from tandem.gateway.endpoints.common import unhonoured

OPERATIONS = (Path(__file__).parents[2] / "docs" / "operations.md").read_text()


def _row() -> str:
    where = "gateway/endpoints/common/unhonoured.py"
    rows = [line for line in OPERATIONS.splitlines() if where in line]
    assert len(rows) == 1, rows
    return rows[0].split("|")[1]


def _names(text: str) -> set[str]:
    return set(re.findall(r"`([a-z_]+)`", text))


def test_the_refusal_row_lists_what_is_refused() -> None:
    cell = _row()
    both, _, chat = cell.partition("On chat also:")
    assert _names(both.partition("On both routes:")[2]) == set(unhonoured._COMMON)
    assert _names(chat) == set(unhonoured._CHAT)


def test_no_honoured_field_is_listed_as_refused() -> None:
    """The README's request-field table says what is honoured; no refusal row names one."""
    honoured = {name for name, row in _request_field_rows().items() if "| honoured |" in row}
    assert {"logprobs", "response_format", "tools", "tool_choice"} <= honoured
    refused_rows = [line for line in OPERATIONS.splitlines() if "unsupported_parameter" in line]
    listed = set().union(*(_names(line.split("|")[1]) for line in refused_rows))
    assert not listed & honoured, sorted(listed & honoured)
