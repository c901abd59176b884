"""``tandem gateway --processes 2``: two real gateway processes on one port over real workers.

The null engine (``--engine null``) serves the routing, metrics, admission, history and
lifecycle checks (it answers at once, or slowly with ``--null-token-delay-ms``); one test
asks the real tiny model for an answer through both processes. Which process served a
request is read from its access-log line: each child logs as ``[gateway-I]`` with the id
the client got in ``x-request-id``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from .multiprocess_probe import (
    CHAT,
    METRICS_ENV,
    MODEL,
    NULL,
    child_pids,
    environ,
    gateway_args,
    metric,
    one_client_per_child,
    post_chat,
    served_by,
)
from .processes import Proc, start_all

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def null_worker(model_cache: Path) -> Iterator[Proc]:
    (worker,) = start_all([NULL])
    yield worker
    worker.stop()


@pytest.fixture(scope="module")
def fast(tmp_path_factory: pytest.TempPathFactory, null_worker: Proc) -> Iterator[Proc]:
    (gateway,) = start_all([gateway_args(null_worker, tmp_path_factory.mktemp("fast"))])
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def slow_worker(model_cache: Path) -> Iterator[Proc]:
    # 0.2 s per token: a 5-token answer holds its admission slot for about a second.
    (worker,) = start_all([[*NULL, "--null-token-delay-ms", "200"]])
    yield worker
    worker.stop()


def test_requests_spread_over_both_processes_and_metrics_add_up(fast: Proc) -> None:
    before = metric(fast.address, "tandem_requests_total", route="chat", status="200")
    sent = 24
    responses = [post_chat(fast.address) for _ in range(sent)]
    assert [r.status_code for r in responses] == [200] * sent
    served = [served_by(fast, r) for r in responses]
    # 24 fresh connections all hashed to one process: odds 2 in 2**24.
    assert served.count(0) > 0 and served.count(1) > 0, served
    # Any process's /metrics counts the requests of both (fresh connections: both answer).
    for _ in range(4):
        after = metric(fast.address, "tandem_requests_total", route="chat", status="200")
        assert after - before == sent
    # Gauges: one worker, healthy in both processes (livemin), nothing in flight (livesum).
    assert metric(fast.address, "tandem_worker_healthy") == 1.0
    assert metric(fast.address, "tandem_worker_in_flight") == 0.0


def test_the_metrics_directory_is_private_to_the_run(fast: Proc) -> None:
    children = child_pids(fast.popen.pid)
    dirs = {environ(pid)[METRICS_ENV] for pid in children}
    assert len(children) == 2 and len(dirs) == 1, dirs
    (path,) = dirs
    assert (Path(path).stat().st_mode & 0o777) == 0o700
    assert (Path(path) / "config.pickle").stat().st_mode & 0o777 == 0o600
    assert METRICS_ENV not in environ(fast.popen.pid)  # the supervisor keeps no registry


def test_worker_admin_writes_are_refused_listing_stays(fast: Proc) -> None:
    added = httpx.post(f"{fast.address}/workers", json={"url": "127.0.0.1:1"}, timeout=10.0)
    assert added.status_code == 409
    assert added.json()["error"]["code"] == "admin_api_multiprocess"
    removed = httpx.delete(f"{fast.address}/workers", params={"url": "x"}, timeout=10.0)
    assert removed.status_code == 409
    assert removed.json()["error"]["code"] == "admin_api_multiprocess"
    assert len(httpx.get(f"{fast.address}/workers", timeout=10.0).json()["workers"]) == 1


def responses_chain(gateway: Proc, turns: int = 4) -> None:
    """A stored Responses chain whose turns alternate between the two children."""
    clients = one_client_per_child(gateway)
    try:
        previous: dict[str, Any] | None = None
        landed = []
        for turn in range(turns):
            client = clients[turn % 2]
            body: dict[str, Any] = {"model": MODEL, "input": f"turn {turn}"}
            body["max_output_tokens"] = 4
            if previous is not None:
                body["previous_response_id"] = previous["id"]
            answer = client.post("/v1/responses", json=body)
            assert answer.status_code == 200, answer.text
            landed.append(served_by(gateway, answer))
            current = answer.json()
            if previous is not None:
                # The earlier turns, stored by the other child, are in this turn's prompt.
                grown = previous["usage"]["input_tokens"] + previous["usage"]["output_tokens"]
                assert current["usage"]["input_tokens"] > grown
            # The other child reads what this one stored.
            other = clients[(turn + 1) % 2]
            stored = other.get(f"/v1/responses/{current['id']}")
            assert stored.status_code == 200 and stored.json()["id"] == current["id"]
            previous = current
        assert set(landed) == {0, 1}, landed
    finally:
        for client in clients.values():
            client.close()


def test_a_responses_chain_continues_across_processes_sqlite(fast: Proc) -> None:
    responses_chain(fast)


def test_a_responses_chain_continues_across_processes_postgres(
    null_worker: Proc, tmp_path: Path, postgres_server: Any
) -> None:
    store = ["--history-backend", "postgres", "--postgres-db-url", postgres_server.new_database()]
    (gateway,) = start_all([gateway_args(null_worker, tmp_path, store=store)])
    try:
        responses_chain(gateway)
    finally:
        gateway.stop()


def test_a_real_model_answers_through_both_processes(tmp_path: Path, model_cache: Path) -> None:
    (worker,) = start_all([["worker", "--model", MODEL]])
    try:
        (gateway,) = start_all([gateway_args(worker, tmp_path)])
        try:
            body = {**CHAT, "temperature": 0, "max_tokens": 4}
            replies = [post_chat(gateway.address, body) for _ in range(8)]
            answers = {r.json()["choices"][0]["message"]["content"] for r in replies}
            # Greedy decoding: one answer, whichever process relayed it.
            assert len(answers) == 1 and next(iter(answers))
        finally:
            gateway.stop()
    finally:
        worker.stop()


def test_the_admission_limit_holds_for_the_whole_gateway(slow_worker: Proc, tmp_path: Path) -> None:
    # 2 running and none queued in all: each process runs 1 (the split), the rest get 429.
    limits = ["--max-concurrent-requests", "2", "--max-queued-requests", "0"]
    (gateway,) = start_all([gateway_args(slow_worker, tmp_path, *limits)])
    try:

        async def burst() -> list[int]:
            async def one() -> int:
                async with httpx.AsyncClient(timeout=30.0) as client:
                    body = {**CHAT, "max_tokens": 5}
                    response = await client.post(
                        f"{gateway.address}/v1/chat/completions", json=body
                    )
                    return response.status_code

            return await asyncio.gather(*(one() for _ in range(8)))

        codes = asyncio.run(burst())
        assert set(codes) <= {200, 429}, codes
        # Per process, a limit of 2 each would have let up to 4 run at once.
        assert 1 <= codes.count(200) <= 2, codes
        rejected = metric(gateway.address, "tandem_admission_rejected_total", reason="queue_full")
        assert rejected == codes.count(429)
    finally:
        gateway.stop()


def test_sigterm_drains_in_flight_requests_and_cleans_up(slow_worker: Proc, tmp_path: Path) -> None:
    (gateway,) = start_all([gateway_args(slow_worker, tmp_path)])
    metrics_path = Path(environ(child_pids(gateway.popen.pid)[0])[METRICS_ENV])
    assert metrics_path.is_dir()

    async def drained() -> list[int]:
        body = {**CHAT, "max_tokens": 8}  # ~1.6 s on the slow worker

        async def one() -> int:
            # A connection each: some land on each process (odds 2 in 2**6 of not).
            async with httpx.AsyncClient(timeout=30.0) as client:
                answer = await client.post(f"{gateway.address}/v1/chat/completions", json=body)
                return answer.status_code

        pending = [asyncio.ensure_future(one()) for _ in range(6)]
        await asyncio.sleep(0.6)
        gateway.popen.send_signal(signal.SIGTERM)
        return list(await asyncio.gather(*pending))

    assert asyncio.run(drained()) == [200] * 6
    assert gateway.popen.wait(30) == 0, gateway.output()[-3000:]
    assert gateway.count("draining in-flight requests") == 2
    assert not metrics_path.exists()


def test_a_killed_process_is_replaced_while_the_other_serves(fast: Proc) -> None:
    counted = metric(fast.address, "tandem_requests_total", route="chat", status="200")
    children = child_pids(fast.popen.pid)
    assert len(children) == 2
    listening_before = fast.count("serving on http://")
    os.kill(children[0], signal.SIGKILL)
    # At once, before any replacement listens: the kernel sends new connections to the
    # process left, and the dead one's counters stay in the sum.
    assert [post_chat(fast.address).status_code for _ in range(6)] == [200] * 6
    deadline = time.monotonic() + 60.0
    while fast.count("serving on http://") == listening_before:
        assert time.monotonic() < deadline, fast.output()[-3000:]
        time.sleep(0.2)
    assert fast.count("restarting it in") == 1
    now = child_pids(fast.popen.pid)
    assert len(now) == 2 and children[0] not in now
    responses = [post_chat(fast.address) for _ in range(16)]
    assert [r.status_code for r in responses] == [200] * 16
    assert {served_by(fast, r) for r in responses} == {0, 1}
    after = metric(fast.address, "tandem_requests_total", route="chat", status="200")
    assert after - counted == 6 + 16


def test_two_supervisors_cannot_share_a_port(fast: Proc, null_worker: Proc, tmp_path: Path) -> None:
    port = fast.address.rsplit(":", 1)[1]
    args = gateway_args(null_worker, tmp_path)
    args[args.index("--port") + 1] = port
    done = subprocess.run(
        [sys.executable, "-m", "tandem.cli", *args], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert "already being served" in done.stderr and "Traceback" not in done.stderr
