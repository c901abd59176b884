"""A child started with ``TANDEM_PARENT_PID`` ends when that parent dies, whichever way.

Real processes: a middle process starts a grandchild that follows it, the test SIGKILLs the
middle one and waits for the grandchild to go. Both ways of noticing are exercised: the
kernel's parent-death signal and the portable poll of the parent pid.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tandem.parent_watch import PARENT_ENV

pytestmark = pytest.mark.processes  # each test starts a parent and a follower

# The grandchild: follow the parent, say so, then sleep far longer than the test waits.
GRANDCHILD = textwrap.dedent(
    """
    import sys, time
    import tandem.parent_watch as watch
    if sys.argv[1] == "poll":
        watch._ask_kernel = lambda: False
    watch.follow_parent()
    print("following", flush=True)
    time.sleep(120)
    """
)
# The middle process: start the grandchild naming itself as parent, print its pid, wait.
MIDDLE = textwrap.dedent(
    """
    import os, subprocess, sys, time
    env = {**os.environ, sys.argv[2]: str(os.getpid())}
    child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[3]], env=env,
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "following"
    print(child.pid, flush=True)
    time.sleep(120)
    """
)


def _alive(pid: int) -> bool:
    try:
        return bool(Path(f"/proc/{pid}/cmdline").read_bytes())
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc to see a grandchild's end")
@pytest.mark.parametrize("how", ["kernel", "poll"])
def test_a_follower_ends_when_its_parent_is_killed(how: str) -> None:
    middle = subprocess.Popen(
        [sys.executable, "-c", MIDDLE, GRANDCHILD, PARENT_ENV, how],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert middle.stdout is not None
        grandchild = int(middle.stdout.readline())
        assert _alive(grandchild)
        middle.kill()
        middle.wait(10)
        deadline = time.monotonic() + 10
        while _alive(grandchild) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(grandchild), f"the {how} watch left pid {grandchild} running"
    finally:
        middle.kill()
        middle.wait(10)


def test_a_follower_of_a_parent_already_gone_ends_at_once() -> None:
    code = "import time, tandem.parent_watch as w; w.follow_parent(); time.sleep(60)"
    # pid 1 is never our parent here (the test runner is), so the parent counts as gone.
    env = {**os.environ, PARENT_ENV: "1"}
    done = subprocess.run([sys.executable, "-c", code], env=env, timeout=30, capture_output=True)
    assert done.returncode == -signal.SIGTERM, done.stderr


def test_without_the_variable_nothing_happens() -> None:
    env = {k: v for k, v in os.environ.items() if k != PARENT_ENV}
    code = "from tandem.parent_watch import follow_parent; follow_parent(); print('still here')"
    done = subprocess.run([sys.executable, "-c", code], env=env, timeout=30, capture_output=True)
    assert done.returncode == 0 and b"still here" in done.stdout, done.stderr
