"""Parallel PD dispatch (gateway/backends/vllm/pd_parallel.py) over scripted workers.

The workers are fakes (fake_worker_client.py): a real worker cannot be made to hold one
leg while the other fails. tests/integration/test_pd_gateway.py runs parallel dispatch
against real workers.
"""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
from dispatch_bench import DECODE_A, PREFILL_A, REQUEST_ID, drain, pd_bench, wait_until
from fake_worker_scripts import (
    Frames,
    decode_answer,
    decode_tokens,
    failing_after,
    held,
    prefill_answer,
    request_kv,
    rpc_error,
)

from tandem.errors import TandemError
from tandem.gateway.model import ModelHandle
from tandem.wire.proto import GenerateRequest, pb


def never() -> asyncio.Future[None]:
    return asyncio.get_running_loop().create_future()


async def test_both_legs_go_at_once_and_meet_at_the_minted_id(model: ModelHandle) -> None:
    bench = await pd_bench(model, pd_dispatch="parallel")
    decode_sent = asyncio.Event()

    def prefill(url: str, request: GenerateRequest) -> Frames:
        # Answers only once the decode leg is out: a dispatcher that waited would hang.
        return held(decode_sent.wait(), prefill_answer(url, request))

    def decode(url: str, request: GenerateRequest) -> Frames:
        decode_sent.set()
        return decode_answer(request)

    bench.workers.handlers.update({PREFILL_A: prefill, DECODE_A: decode})
    ctx = await bench.context(max_tokens=8, stop_token_ids=[5])
    assert ctx.wire is not None
    asked = ctx.wire.SerializeToString(deterministic=True)

    async with asyncio.timeout(5):
        frames = await drain(await bench.open(ctx))

    prefill_leg, decode_leg = bench.only_call(PREFILL_A).request, bench.only_call(DECODE_A).request
    tag = request_kv(prefill_leg)
    minted = tag["transfer_id"]
    assert isinstance(minted, str) and minted.startswith("xfer-")
    assert tag == {"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": minted}
    assert request_kv(decode_leg) == {
        "do_remote_decode": False,
        "do_remote_prefill": True,
        "transfer_id": minted,
        "remote_host": "127.0.0.1",
        "remote_port": 7101,
    }
    params = prefill_leg.sampling_params
    assert (params.max_tokens, params.n, list(params.stop_token_ids)) == (1, 1, [])
    assert params.ignore_eos and not prefill_leg.stream
    assert decode_leg.sampling_params.max_tokens == 8
    assert list(decode_leg.sampling_params.stop_token_ids) == [5]
    assert ctx.wire.SerializeToString(deterministic=True) == asked
    assert [f.token_ids for f in frames if not f.final] == [decode_tokens(decode_leg)]
    assert bench.workers.aborts == [] and bench.workers.releases == []
    assert set(bench.in_flight().values()) == {0}


async def test_image_pixels_go_with_the_prefill_leg_only(model: ModelHandle) -> None:
    bench = await pd_bench(model, pd_dispatch="parallel")
    ctx = await bench.context(images=1)
    await drain(await bench.open(ctx))
    prefill, decode = bench.only_call(PREFILL_A), bench.only_call(DECODE_A)
    assert prefill.pixels is not None and decode.pixels is None
    assert request_kv(decode.request)["transfer_id"] == request_kv(prefill.request)["transfer_id"]
    assert ctx.pixels is None


@pytest.mark.parametrize("failing", ["prefill", "decode"])
async def test_the_first_failing_leg_answers_at_once_and_the_other_is_aborted(
    model: ModelHandle, failing: str
) -> None:
    # No retry: a prefill that failed to start would be retried on another pair.
    bench = await pd_bench(model, pd_dispatch="parallel", max_retries=0)
    failing_url, other_url = (
        (PREFILL_A, DECODE_A) if failing == "prefill" else (DECODE_A, PREFILL_A)
    )

    def fail(url: str, request: GenerateRequest) -> list[pb.GenerateResponse]:
        raise rpc_error(grpc.StatusCode.UNAVAILABLE, f"{failing} worker is down")

    def stall(url: str, request: GenerateRequest) -> Frames:
        return held(never(), decode_answer(request))  # would never answer

    bench.workers.handlers.update({failing_url: fail, other_url: stall})
    ctx = await bench.context()

    async with asyncio.timeout(5):  # not waiting for the other leg
        with pytest.raises(TandemError) as caught:
            await bench.open(ctx)

    assert caught.value.code == f"{failing}_worker_failed_to_start"
    assert bench.workers.aborts == [(other_url, REQUEST_ID)]  # dropped on its worker
    assert bench.failures(failing_url) == 1 and bench.failures(other_url) == 0
    assert set(bench.in_flight().values()) == {0}


async def test_a_decode_leg_that_already_answered_is_dropped_when_the_prefill_fails(
    model: ModelHandle,
) -> None:
    bench = await pd_bench(model, pd_dispatch="parallel", max_retries=0)

    async def decode_started() -> None:
        calls = bench.workers.calls
        await wait_until(lambda: any(c.url == DECODE_A and c.stream.started for c in calls))

    bench.workers.handlers[PREFILL_A] = lambda url, request: failing_after(
        decode_started(), rpc_error(grpc.StatusCode.UNAVAILABLE, "prefill worker is down")
    )
    ctx = await bench.context()

    with pytest.raises(TandemError) as caught:
        await bench.open(ctx)

    assert caught.value.code == "prefill_worker_failed_to_start"
    assert bench.workers.aborts == [(DECODE_A, REQUEST_ID)]  # its first frame was in: Abort
    assert set(bench.in_flight().values()) == {0}


async def test_decode_failing_after_the_prefill_finished_releases_its_kv(
    model: ModelHandle,
) -> None:
    bench = await pd_bench(model, pd_dispatch="parallel")

    async def prefill_done() -> None:
        await wait_until(lambda: bench.only_call(PREFILL_A).stream.completed)

    bench.workers.handlers[DECODE_A] = lambda url, request: failing_after(
        prefill_done(), rpc_error(grpc.StatusCode.INTERNAL, "KV pull failed")
    )
    ctx = await bench.context()

    with pytest.raises(TandemError) as caught:
        await bench.open(ctx)

    assert caught.value.code == "decode_worker_failed_to_start"
    minted = request_kv(bench.only_call(PREFILL_A).request)["transfer_id"]
    assert bench.workers.releases == [(PREFILL_A, minted)]  # nobody will pull that KV now
    assert bench.workers.aborts == []  # the prefill call had completed: nothing to abort
    assert (bench.failures(PREFILL_A), bench.failures(DECODE_A)) == (0, 1)
    assert set(bench.in_flight().values()) == {0}


async def test_client_leaving_before_the_first_frame_defers_the_decode_abort(
    model: ModelHandle,
) -> None:
    bench = await pd_bench(model, pd_dispatch="parallel")
    pulled = asyncio.Event()
    bench.workers.handlers[DECODE_A] = lambda url, request: held(
        pulled.wait(), decode_answer(request)
    )
    ctx = await bench.context()
    opening = asyncio.ensure_future(bench.open(ctx))
    await wait_until(lambda: bool(bench.workers.calls_to(DECODE_A)))
    await wait_until(lambda: bench.only_call(PREFILL_A).stream.completed)

    opening.cancel()
    with pytest.raises(asyncio.CancelledError):
        await opening

    minted = request_kv(bench.only_call(PREFILL_A).request)["transfer_id"]
    assert bench.workers.releases == [(PREFILL_A, minted)]
    assert bench.workers.aborts == []
    pulled.set()
    await wait_until(lambda: bench.workers.aborts != [])
    assert bench.workers.aborts == [(DECODE_A, REQUEST_ID)]
    assert json.loads(bench.only_call(DECODE_A).request.kv_transfer_params_json)["transfer_id"] == (
        minted
    )
