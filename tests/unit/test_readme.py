"""The README's flag, error and metrics tables list everything the code defines."""

from __future__ import annotations

import argparse
from pathlib import Path

import prometheus_client
import pytest

from tandem.cli import build_parser
from tandem.errors import ERROR_CATALOGUE
from tandem.gateway import metrics
from tandem.gateway.endpoints.chat.schema import ChatCompletionRequest
from tandem.gateway.endpoints.common import unhonoured
from tandem.gateway.endpoints.completions.schema import CompletionRequest
from tandem.gateway.endpoints.responses import request as responses_request
from tandem.gateway.endpoints.responses.request import ResponsesRequest

README = (Path(__file__).parents[2] / "README.md").read_text()


def test_every_error_code_is_documented() -> None:
    missing = [code for code in ERROR_CATALOGUE if f"| `{code}` |" not in README]
    assert not missing, missing


def test_every_metric_is_documented() -> None:
    kinds = (prometheus_client.Counter, prometheus_client.Histogram, prometheus_client.Gauge)
    names = [
        m._name + ("_total" if isinstance(m, prometheus_client.Counter) else "")
        for m in vars(metrics).values()
        if isinstance(m, kinds)
    ]
    missing = [name for name in names if f"`{name}`" not in README]
    assert names and not missing, missing


def test_quickstart_shows_the_two_commands() -> None:
    assert "make serve" in README and "make test" in README


def _commands() -> dict[str, argparse.ArgumentParser]:
    actions = build_parser()._actions
    commands = next(a for a in actions if isinstance(a, argparse._SubParsersAction))
    return dict(commands.choices)


def _flags(parser: argparse.ArgumentParser) -> list[str]:
    """A command's flags, those of its own subcommands (`tandem models train`) included."""
    flags = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                flags += _flags(sub)
        flags += [o for o in action.option_strings if o.startswith("--") and o != "--help"]
    return flags


@pytest.mark.parametrize("command", sorted(_commands()))
def test_every_flag_is_documented(command: str) -> None:
    flags = _flags(_commands()[command])
    missing = [flag for flag in flags if f"`{flag}" not in README and f" {flag}" not in README]
    assert flags and not missing, missing


def _request_field_rows(heading: str = "## Request fields") -> dict[str, str]:
    """Field → its row in the README's request-fields table under ``heading``."""
    section = README.split(heading, 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        if line.startswith("| `"):
            names = line.split("|")[1]
            for name in names.replace("`", "").split(","):
                rows[name.strip()] = line
    return rows


def test_every_request_field_is_marked_honoured_or_refused() -> None:
    rows = _request_field_rows()
    declared = set(ChatCompletionRequest.model_fields) | set(CompletionRequest.model_fields)
    refused = set(unhonoured._COMMON) | set(unhonoured._CHAT)
    missing = sorted((declared | refused) - set(rows))
    assert not missing, missing
    wrong = sorted(name for name in refused if "| refused |" not in rows[name])
    assert not wrong, wrong


def test_every_responses_field_is_marked_honoured_or_refused() -> None:
    rows = _request_field_rows("## The Responses API")
    declared = set(ResponsesRequest.model_fields)
    missing = sorted((declared | set(responses_request._REFUSED)) - set(rows))
    assert not missing, missing
    wrong = sorted(name for name in responses_request._REFUSED if "| refused |" not in rows[name])
    assert not wrong, wrong


def test_builtin_models_section_matches_the_generator() -> None:
    from tandem.engine.builtin_shapes import COLOURS, SHAPES, TEXT_ONLY_REPLY
    from tandem.engine.builtin_specs import BUILTIN_SPECS

    section = README[README.index("### What the built-in models can and cannot do") :]
    section = section[: section.index("\n## ")]
    assert f"`{TEXT_ONLY_REPLY}`" in section
    assert all(colour in section for colour in COLOURS)
    assert all(shape in section for shape in SHAPES)
    for spec in BUILTIN_SPECS.values():
        assert spec.training is not None
        low, high = spec.training.image_sides
        assert f"{low} to {high} pixels a side" in section, spec.name
