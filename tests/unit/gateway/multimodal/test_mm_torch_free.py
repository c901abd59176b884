"""The gateway's multimodal package must import without torch (the gateway runs without it)."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.processes
def test_gateway_multimodal_imports_no_torch() -> None:
    code = (
        "import sys, tandem.gateway.multimodal\n"
        "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
