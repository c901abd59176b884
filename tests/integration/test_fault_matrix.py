"""SIGKILL and SIGSTOP of each PD role at each phase of a request (issue 38, item 3).

Null-engine workers (canned tokens paced at ``TOKEN_MS``, no model weights, but the real
gRPC protocol, the real KV handoff and the real leases) behind a PD gateway, fresh for every
case. Each phase is reached by holding a worker with SIGSTOP, so the fault lands where the
case says and not by luck of timing:

- ``before``: before any token. Sequential dispatch with the prefill held (only the prefill
  leg is out), or the decode worker held while the prefill's KV waits for it;
- ``pull``: parallel dispatch with the prefill held, so the decode leg's KV pull is open at
  the prefill worker, waiting for the KV to appear;
- ``stream``: at the first streamed token.

SIGKILL kills the held worker there; SIGSTOP keeps it held past the request's deadline,
then lets it go. For every case: the client's outcome (answered, or exactly which code), no
gRPC words, no traceback in the gateway's log, and no KV lease held and no request running
on any live worker afterwards (the workers' own counters).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from .fault_outcome import Outcome, assert_no_traceback, in_background, nothing_held, streamed
from .gateway_probe import chat, eventually
from .processes import Proc, start_all
from .wire_helpers import stats

MODEL = "tiny-qwen3-vl"
TOKEN_MS = 30
MAX_TOKENS = 48  # ~1.5 s of tokens: a stream is still running when the fault lands
DEADLINE_S = 4.0
LEASE_S = 1.0
HELD_S = 0.4  # how long a case waits for the legs to reach the held worker


@pytest.fixture
def scene(request: pytest.FixtureRequest, model_cache: Path) -> Iterator[dict[str, Proc]]:
    dispatch = request.param
    prefill, decode = start_all(
        [
            ["worker", "--model", MODEL, "--engine", "null", "--role", "prefill",
             "--kv-lease-secs", str(LEASE_S)],
            ["worker", "--model", MODEL, "--engine", "null", "--role", "decode",
             "--null-token-delay-ms", str(TOKEN_MS), "--kv-pull-wait-secs", "2"],
        ]
    )  # fmt: skip
    (gateway,) = start_all(
        [
            [
                "gateway", "--port", "0", "--pd-disaggregation", "--prefill", prefill.address,
                "--decode", decode.address, "--pd-dispatch", dispatch,
                "--request-timeout-secs", str(DEADLINE_S), "--max-retries", "0",
                "--health-check-interval-secs", "600",
            ]
        ]
    )  # fmt: skip
    yield {"prefill": prefill, "decode": decode, "gateway": gateway}
    for proc in (gateway, decode, prefill):
        if proc.popen.poll() is None:
            proc.popen.send_signal(signal.SIGCONT)
        proc.stop(signal.SIGKILL)


def body() -> dict:
    return chat(MODEL, stream=True, max_tokens=MAX_TOKENS, ignore_eos=True)


async def _stored(worker: Proc) -> bool:
    return int((await stats(worker.address))["held_kv_blocks"]) > 0


async def fault_before_first_token(procs: dict[str, Proc], role: str, sig: int) -> Outcome:
    url = f"{procs['gateway'].address}/v1/chat/completions"
    held = procs[role]
    held.popen.send_signal(signal.SIGSTOP)
    answer = await in_background(streamed(url, body()))
    if role == "decode":
        await eventually(lambda: _stored(procs["prefill"]))  # the prefill's KV waits for it
    else:
        await asyncio.sleep(HELD_S)
    if sig == signal.SIGKILL:
        held.popen.send_signal(signal.SIGKILL)
        return await asyncio.wait_for(answer, 30)
    outcome = await asyncio.wait_for(answer, 30)  # held past the deadline
    held.popen.send_signal(signal.SIGCONT)
    return outcome


async def fault_at_first_token(procs: dict[str, Proc], role: str, sig: int) -> Outcome:
    url = f"{procs['gateway'].address}/v1/chat/completions"
    held = procs[role]
    outcome = await streamed(url, body(), on_token=lambda: held.popen.send_signal(sig))
    if sig == signal.SIGSTOP:
        held.popen.send_signal(signal.SIGCONT)
    return outcome


BEFORE = [
    # (role, signal, the client's outcome)
    ("prefill", signal.SIGKILL, "prefill_worker_failed_to_start"),
    ("prefill", signal.SIGSTOP, "request_timeout"),
    ("decode", signal.SIGKILL, "decode_worker_failed_to_start"),
    ("decode", signal.SIGSTOP, "request_timeout"),
]


@pytest.mark.parametrize("scene", ["sequential"], indirect=True)
@pytest.mark.parametrize(("role", "sig", "code"), BEFORE, ids=lambda v: str(v))
async def test_a_fault_before_the_first_token_is_a_coded_error(scene, role, sig, code) -> None:
    outcome = await fault_before_first_token(scene, role, sig)
    assert outcome.code == code, outcome
    assert outcome.status == (504 if sig == signal.SIGSTOP else 503), outcome
    assert outcome.tokens == 0
    await nothing_held([scene["prefill"], scene["decode"]], within=LEASE_S + 3)
    assert_no_traceback(scene["gateway"])


PULL = [
    ("prefill", signal.SIGKILL, "prefill_worker_failed_to_start"),
    ("prefill", signal.SIGSTOP, "request_timeout"),
    ("decode", signal.SIGKILL, "decode_worker_failed_to_start"),
    ("decode", signal.SIGSTOP, "request_timeout"),
]


@pytest.mark.parametrize("scene", ["parallel"], indirect=True)
@pytest.mark.parametrize(("role", "sig", "code"), PULL, ids=lambda v: str(v))
async def test_a_fault_during_the_kv_pull_is_a_coded_error(scene, role, sig, code) -> None:
    """The prefill is held, so the decode leg's pull waits at it; then ``role`` is hit."""
    url = f"{scene['gateway'].address}/v1/chat/completions"
    prefill = scene["prefill"]
    prefill.popen.send_signal(signal.SIGSTOP)
    answer = await in_background(streamed(url, body()))
    await asyncio.sleep(HELD_S)  # both legs are out; the decode leg's pull waits
    if role == "decode":
        scene["decode"].popen.send_signal(sig)
        prefill.popen.send_signal(signal.SIGCONT)  # the prefill's KV now waits for nobody
    elif sig == signal.SIGKILL:
        prefill.popen.send_signal(signal.SIGKILL)
    outcome = await asyncio.wait_for(answer, 30)
    for proc in (prefill, scene["decode"]):
        if proc.popen.poll() is None:
            proc.popen.send_signal(signal.SIGCONT)
    assert outcome.code == code, outcome
    assert outcome.status == (504 if sig == signal.SIGSTOP else 503), outcome
    assert outcome.tokens == 0
    await nothing_held([prefill, scene["decode"]], within=LEASE_S + 3)
    assert_no_traceback(scene["gateway"])


STREAM = [
    # A prefill worker is done once its KV is pulled: the stream does not notice it.
    ("prefill", signal.SIGKILL, None),
    ("prefill", signal.SIGSTOP, None),
    ("decode", signal.SIGKILL, "decode_stream_error"),
    ("decode", signal.SIGSTOP, "decode_stream_error"),  # cut at the deadline
]


@pytest.mark.parametrize("scene", ["parallel"], indirect=True)
@pytest.mark.parametrize(("role", "sig", "code"), STREAM, ids=lambda v: str(v))
async def test_a_fault_mid_stream(scene, role, sig, code) -> None:
    outcome = await fault_at_first_token(scene, role, sig)
    assert outcome.code == code, outcome
    if code is None:
        assert outcome.tokens == MAX_TOKENS
    else:
        assert 0 < outcome.tokens < MAX_TOKENS
    await nothing_held([scene["prefill"], scene["decode"]], within=LEASE_S + 3)
    assert_no_traceback(scene["gateway"])
