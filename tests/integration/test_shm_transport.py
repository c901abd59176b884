"""Same-host shared-memory tensors (``--multimodal-tensor-transport``) with real processes.

The same image answer through shared memory as inline, aggregated and PD; only the leg that
carries pixels uses segments; and no segment outlives its request, also when the worker or
the gateway is killed mid-request. A worker stopped with SIGSTOP stands in for one that has
not read its request yet: the segment is written, nobody has read it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path

import grpc
import openai
import pytest

from tandem.wire.proto import TensorData, common, pb
from tandem.wire.shm import shm_namespace_id

from .image_server import image_messages
from .multiprocess_probe import child_pids
from .processes import SINGLE_PROCESS, Proc, start_all
from .wire_helpers import call, generate, healthy, request, stats

SHM = Path("/dev/shm")
MODEL = "tiny-qwen3-vl"
ROUTER = ["gateway", "--port", "0", "--mm-processing", "router"]
# Small enough that the tiny model's pixel tensor goes through shared memory.
SHM_ARGS = ["--multimodal-tensor-transport", "shm", "--multimodal-shm-min-bytes", "1024"]
AUTO_ARGS = ["--multimodal-tensor-transport", "auto", "--multimodal-shm-min-bytes", "1024"]
NULL = ["worker", "--engine", "null", "--mm-processor", "off"]


def segments_of(proc: Proc) -> set[str]:
    """The /dev/shm segments written by ``proc`` (other people's tests write their own),
    or by its children: under ``--processes N`` the gateway processes are its children."""
    prefixes = tuple(f"tandem-{pid}-" for pid in [proc.popen.pid, *child_pids(proc.popen.pid)])
    return {name for name in os.listdir(SHM) if name.startswith(prefixes)}


def client(gateway: Proc, timeout: float = 60.0) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{gateway.address}/v1", api_key="x", max_retries=0, timeout=timeout
    )


def answer(gateway: Proc, seed: int) -> str:
    reply = client(gateway).chat.completions.create(
        model=MODEL, messages=image_messages(seed), max_tokens=6, temperature=0
    )
    return reply.choices[0].message.content or ""


def leg(address: str, name: str) -> dict[str, int]:
    legs = asyncio.run(stats(address))["leg_bytes"]
    return legs.get(name, {"requests": 0, "pixel_bytes": 0, "shm_bytes": 0})


@pytest.fixture(scope="module")
def cluster(model_cache: Path):
    agg, prefill, decode = start_all(
        [
            ["worker", "--model", MODEL, "--role", "both"],
            ["worker", "--model", MODEL, "--role", "prefill"],
            ["worker", "--model", MODEL, "--role", "decode"],
        ]
    )
    pd = ["--pd-disaggregation", "--prefill", prefill.address, "--decode", decode.address]
    inline, shm, auto_pd = start_all(
        [
            [*ROUTER, "--worker-urls", agg.address],
            [*ROUTER, *SHM_ARGS, "--worker-urls", agg.address],
            [*ROUTER, *AUTO_ARGS, *pd],
        ]
    )
    procs = {"agg": agg, "prefill": prefill, "decode": decode}
    procs |= {"inline": inline, "shm": shm, "auto_pd": auto_pd}
    yield procs
    for proc in procs.values():
        proc.stop()


def test_image_through_shm_gives_the_inline_answer(cluster) -> None:
    expected = answer(cluster["inline"], seed=3)
    before = leg(cluster["agg"].address, "aggregated")
    assert answer(cluster["shm"], seed=3) == expected
    after = leg(cluster["agg"].address, "aggregated")
    assert after["shm_bytes"] - before["shm_bytes"] > 1024
    # The worker unlinked what it read; the gateway keeps nothing behind.
    assert segments_of(cluster["shm"]) == set()


def test_auto_pd_sends_only_the_prefill_leg_through_shm(cluster) -> None:
    expected = answer(cluster["inline"], seed=4)
    prefill_before = leg(cluster["prefill"].address, "prefill")
    decode_before = leg(cluster["decode"].address, "decode")
    assert answer(cluster["auto_pd"], seed=4) == expected
    prefill_after = leg(cluster["prefill"].address, "prefill")
    decode_after = leg(cluster["decode"].address, "decode")
    # Tandem workers advertise our shm_namespace_id, so auto chose shared memory.
    assert prefill_after["shm_bytes"] - prefill_before["shm_bytes"] > 1024
    assert decode_after["requests"] == decode_before["requests"] + 1
    assert decode_after["shm_bytes"] == decode_before["shm_bytes"]
    assert decode_after["pixel_bytes"] == decode_before["pixel_bytes"]  # no pixels on decode
    assert segments_of(cluster["auto_pd"]) == set()


def _send_in_background(gateway: Proc, outcome: dict[str, BaseException | None]) -> None:
    def run() -> None:
        try:
            answer(gateway, seed=5)
            outcome["error"] = None
        except BaseException as exc:  # the failure is the expected outcome
            outcome["error"] = exc

    threading.Thread(target=run, daemon=True).start()


def _wait_for(predicate, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_worker_killed_before_reading_leaves_no_segment(model_cache: Path) -> None:
    (worker,) = start_all([NULL])
    (gateway,) = start_all([[*ROUTER, *SHM_ARGS, "--worker-urls", worker.address]])
    try:
        # The null engine (benchmarks) reads shared-memory tensors like the embedded one.
        assert answer(gateway, seed=6).startswith("null")
        assert leg(worker.address, "aggregated")["shm_bytes"] > 1024
        worker.popen.send_signal(signal.SIGSTOP)  # it will not read the request
        outcome: dict[str, BaseException | None] = {}
        _send_in_background(gateway, outcome)
        assert _wait_for(lambda: bool(segments_of(gateway))), gateway.output()[-2000:]
        written = segments_of(gateway)
        worker.popen.send_signal(signal.SIGKILL)
        worker.popen.wait(60)  # the reap itself, which two busy cores can make slow
        # The call fails; the gateway unlinks the segment nobody read.
        assert _wait_for(lambda: "error" in outcome)
        assert isinstance(outcome["error"], openai.APIStatusError)
        assert _wait_for(lambda: not (segments_of(gateway) & written), timeout=10)
    finally:
        worker.stop(signal.SIGKILL)
        gateway.stop()


def test_gateway_killed_mid_request_is_swept_by_the_next_gateway(model_cache: Path) -> None:
    (worker,) = start_all([NULL])
    # single_process: the gateway killed outright must be the process that wrote the
    # segment (a supervisor's children would be told to stop, and clean up themselves)
    gateway_args = [*ROUTER, *SHM_ARGS, "--worker-urls", worker.address, *SINGLE_PROCESS]
    (gateway,) = start_all([gateway_args])
    try:
        worker.popen.send_signal(signal.SIGSTOP)
        outcome: dict[str, BaseException | None] = {}
        _send_in_background(gateway, outcome)
        assert _wait_for(lambda: bool(segments_of(gateway))), gateway.output()[-2000:]
        gateway.stop(signal.SIGKILL)  # no cleanup of its own can run
        left = segments_of(gateway)
        assert left, "the killed gateway's segment should still be there"
        # The worker never reads it: it dies too, before the next gateway starts.
        worker.stop(signal.SIGKILL)
        (successor,) = start_all([["gateway", "--port", "0"]])
        try:
            assert not any((SHM / name).exists() for name in left)
        finally:
            successor.stop()
    finally:
        worker.stop(signal.SIGKILL)
        gateway.stop(signal.SIGKILL)


def test_worker_advertises_its_namespace_and_refuses_bad_handles(cluster) -> None:
    address = cluster["agg"].address
    info = asyncio.run(call(address, "GetServerInfo", pb.GetServerInfoRequest()))
    assert info.shm_namespace_id == shm_namespace_id() != ""
    ids = [1, 2, 3]
    for handle, reason in [
        (common.ShmHandle(name="../../etc/passwd", nbytes=12), "invalid TensorData.shm name"),
        (common.ShmHandle(name="tandem-0-0-0", nbytes=12), "cannot be opened on this worker"),
        (common.ShmHandle(name="tandem-0-0-0", nbytes=99), "byte length mismatch"),
    ]:
        req = request("bad-shm", ids, max_tokens=2)
        batch = req.mm_inputs
        batch.im_token_id = 5
        batch.mm_placeholders.add(offset=0, length=1)
        batch.mm_hashes.append("h")
        batch.pixel_values.CopyFrom(TensorData(shape=[3], dtype="float32", shm=handle))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            asyncio.run(generate(address, req))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert reason in (caught.value.details() or "")
    assert asyncio.run(healthy(address))
