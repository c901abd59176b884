"""``exit_without_teardown`` in a real child process: what a clean exit must still do.

The function ends its process, so each case runs it in a fresh interpreter and reads what
that interpreter left behind: its exit code, its buffered output, its exit handlers' work.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.processes

CHILD = textwrap.dedent(
    """
    import atexit, logging, sys, threading, time
    from tandem.process_exit import exit_without_teardown

    atexit.register(lambda: print("atexit ran", flush=True))
    # Buffered, unflushed: a plain os._exit would lose both lines.
    sys.stdout = open(sys.stdout.fileno(), "w", buffering=1 << 16, closefd=False)
    print("buffered stdout")
    sys.stderr.write("stderr line\\n")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.info("logged line")
    # A thread that would keep a normal exit waiting forever.
    threading.Thread(target=time.sleep, args=(600,)).start()
    exit_without_teardown(int(sys.argv[1]))
    print("after exit")
    """
)


def _run(code: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CHILD, str(code)], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("code", [0, 3])
def test_exit_code_is_kept(code: int) -> None:
    assert _run(code).returncode == code


def test_exit_handlers_run_and_output_is_flushed() -> None:
    done = _run(0)
    assert done.stdout.splitlines() == ["buffered stdout", "atexit ran"]
    assert "stderr line" in done.stderr
    assert "logged line" in done.stderr


def test_nothing_runs_after_it_and_live_threads_do_not_hold_the_exit() -> None:
    # The 600 s sleeper thread would make a normal exit hit the 60 s timeout in _run.
    done = _run(0)
    assert "after exit" not in done.stdout
