"""The CLI parses its commands and reports honestly what it can run."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.processes
def test_help_lists_commands() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tandem.cli", "--help"], capture_output=True, text=True, check=True
    )
    assert "serve" in out.stdout
