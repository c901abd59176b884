"""Helpers of the ``--processes N`` integration tests: start arguments, which child served a
request (its ``[gateway-I]`` access line), clients pinned to a child, /proc lookups."""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx

from .processes import Proc

NULL = ["worker", "--engine", "null", "--mm-processor", "off", "--role", "both"]
MODEL = "tiny-qwen3-vl"
TWO = ["--processes", "2", "--mm-workers", "0"]
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
METRICS_ENV = "PROMETHEUS_MULTIPROC_DIR"


def sqlite_store(tmp: Path) -> list[str]:
    return ["--history-backend", "sqlite", "--history-sqlite-path", str(tmp / "h.sqlite3")]


def gateway_args(worker: Proc, tmp: Path, *extra: str, store: list[str] | None = None) -> list[str]:
    history = sqlite_store(tmp) if store is None else store
    return ["gateway", "--port", "0", "--worker-urls", worker.address, *TWO, *history, *extra]


def post_chat(base: str, body: dict | None = None) -> httpx.Response:
    # A fresh connection each time: the kernel picks the process per connection.
    with httpx.Client(timeout=30.0) as client:
        return client.post(f"{base}/v1/chat/completions", json=body or CHAT)


def metric(base: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    text = httpx.get(f"{base}/metrics", timeout=10.0).text
    total = 0.0
    for line in text.splitlines():
        match = re.match(rf"{name}(?:\{{(.*)\}})? (\S+)$", line)
        if match and all(f'{k}="{v}"' in (match.group(1) or "") for k, v in labels.items()):
            total += float(match.group(2))
    return total


def served_by(gateway: Proc, response: httpx.Response) -> int:
    """The index of the child whose access log holds this response's request id."""
    needle = f"id={response.headers['x-request-id']} "
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        for line in list(gateway.lines):
            if needle in line and (match := re.search(r"\[gateway-(\d+)\]", line)):
                return int(match.group(1))
        time.sleep(0.05)
    raise AssertionError(f"no access line for {needle}:\n{gateway.output()[-3000:]}")


def one_client_per_child(gateway: Proc) -> dict[int, httpx.Client]:
    """A keep-alive client (one connection each) pinned to each of the two children."""
    found: dict[int, httpx.Client] = {}
    for _ in range(40):  # all 40 on one child: odds 2 in 2**40
        client = httpx.Client(
            base_url=gateway.address, timeout=30.0, limits=httpx.Limits(max_connections=1)
        )
        child = served_by(gateway, client.post("/v1/chat/completions", json=CHAT))
        if child in found:
            client.close()
        else:
            found[child] = client
        if len(found) == 2:
            return found
    raise AssertionError(f"every connection went to child {list(found)}")


def child_pids(parent: int) -> list[int]:
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended while we looked
        if int(fields[1]) == parent:
            pids.append(int(stat.parent.name))
    return pids


def alive(pid: int) -> bool:
    # A zombie still has /proc/<pid>; only a live process has a non-empty command line.
    try:
        return bool(Path(f"/proc/{pid}/cmdline").read_bytes())
    except OSError:
        return False


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)
