"""On a failing integration test, attach the logs of the processes it ran against."""

from __future__ import annotations

import pytest

from .processes import LIVE


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for proc in LIVE:
            if proc.popen.poll() is None or proc.lines:
                tail = "\n".join(list(proc.lines)[-40:])
                report.sections.append((f"log of {' '.join(proc.args[:4])}", tail))
