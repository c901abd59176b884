"""On a failing compatibility test, attach the logs of the processes it ran against."""

from tests.integration.conftest import pytest_runtest_makereport  # noqa: F401
