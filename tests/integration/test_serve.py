"""`tandem serve` end to end: the printed examples work, and Ctrl-C leaves nothing behind."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tandem.serve.examples import CURL_BEGIN, EXPECTED_REPLY, PYTHON_BEGIN, extract

from .processes import Proc, start

pytestmark = pytest.mark.slow

CHILD = re.compile(r"^TANDEM_CHILD (\S+) (\d+)$", re.M)
LISTENING = re.compile(r"TANDEM_(?:WORKER|GATEWAY)_READY (?:http://)?127\.0\.0\.1:(\d+)")


def serve(*args: str) -> Proc:
    proc, _ = start(["serve", "--port", "0", *args])
    deadline = time.monotonic() + 120
    while "TANDEM_SERVE_READY" not in proc.output():
        if proc.popen.poll() is not None or time.monotonic() > deadline:
            proc.stop(signal.SIGKILL)
            pytest.fail(f"tandem serve did not become ready:\n{proc.output()[-4000:]}")
        time.sleep(0.2)
    return proc


def children(proc: Proc) -> dict[str, int]:
    return {role: int(pid) for role, pid in CHILD.findall(proc.output())}


def ports(proc: Proc) -> list[int]:
    return [int(port) for port in LISTENING.findall(proc.output())]


def alive(pid: int) -> bool:
    # A zombie still has /proc/<pid>; only a live one has a non-empty command line.
    try:
        return bool(Path(f"/proc/{pid}/cmdline").read_bytes())
    except OSError:
        return False


def listening(port: int) -> bool:
    # SO_REUSEADDR ignores TIME_WAIT leftovers; only a socket still bound refuses the bind.
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def assert_all_gone(proc: Proc, pids: dict[str, int], bound: list[int]) -> None:
    assert pids and bound
    left = {role: pid for role, pid in pids.items() if alive(pid)}
    assert not left, f"children still running: {left}\n{proc.output()[-3000:]}"
    assert not [port for port in bound if listening(port)], f"ports still bound: {bound}"


def run_python_example(output: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", extract(output, PYTHON_BEGIN)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize(
    ("args", "roles"),
    [
        ((), {"prefill-0", "decode-0", "gateway"}),
        (("--aggregated", "--model", "tiny-llava-1.5"), {"worker-0", "gateway"}),
    ],
    ids=["pd-qwen", "aggregated-llava"],
)
def test_serve_examples_work_and_sigint_cleans_up(
    model_cache: Path, args: tuple[str, ...], roles: set[str]
) -> None:
    proc = serve(*args)
    try:
        output = proc.output()
        assert set(children(proc)) == roles
        # The banner says what to expect, and the trained built-in model says just that.
        assert f"expect {EXPECTED_REPLY!r}" in output
        assert run_python_example(output).strip() == EXPECTED_REPLY
        if shutil.which("curl") and shutil.which("base64"):
            curl = subprocess.run(
                ["bash", "-c", extract(output, CURL_BEGIN)],
                capture_output=True,
                text=True,
                timeout=60,
            )
            reply = json.loads(curl.stdout)["choices"][0]["message"]["content"]
            assert reply.strip() == EXPECTED_REPLY, curl.stderr
    finally:
        code = proc.stop(signal.SIGINT, timeout=20)
    assert code == 0, proc.output()[-3000:]
    assert "all processes stopped" in proc.output()
    assert_all_gone(proc, children(proc), ports(proc))


def test_serve_stops_everything_when_a_child_dies(model_cache: Path) -> None:
    proc = serve()
    pids = children(proc)
    os.kill(pids["decode-0"], signal.SIGKILL)
    try:
        proc.popen.wait(20)
    finally:
        proc.stop(signal.SIGKILL)
    assert proc.popen.returncode == 1, proc.output()[-3000:]
    assert "decode-0" in proc.output() and "killed by signal 9" in proc.output()
    assert_all_gone(proc, pids, ports(proc))


def test_serve_killed_outright_takes_its_children_along(model_cache: Path) -> None:
    """SIGKILL gives the launcher no chance to stop anything: the children must notice."""
    proc = serve()
    pids, bound = children(proc), ports(proc)
    proc.popen.kill()
    proc.popen.wait(60)  # the reap itself, which two busy cores can make slow
    deadline = time.monotonic() + 30  # each child drains gracefully on its SIGTERM
    while any(alive(pid) for pid in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert_all_gone(proc, pids, bound)


def test_serve_refuses_an_unknown_model_before_starting_anything(model_cache: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tandem.cli", "serve", "--port", "0", "--model", "no-such-model"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "no-such-model" in done.stderr and "TANDEM_CHILD" not in done.stdout
