"""The shared retry loop (gateway/dispatch/retry.py) under both dispatchers.

Scripted workers (fake_worker_client.py) fail exactly the call a test names; real
workers cannot. The retry path also runs against real processes in
tests/integration/test_pd_gateway.py.
"""

from __future__ import annotations

import grpc
import pytest
from dispatch_bench import (
    DECODE_A,
    DECODE_B,
    PREFILL_A,
    PREFILL_B,
    PREFILL_C,
    REGULAR_A,
    REGULAR_B,
    REQUEST_ID,
    Bench,
    aggregated_bench,
    drain,
    pd_bench,
)
from fake_worker_scripts import Frames, is_prefill_leg, rpc_error, well_behaved

from tandem.errors import TandemError
from tandem.gateway.model import ModelHandle
from tandem.wire.proto import GenerateRequest


def fail_first(
    bench: Bench,
    error: grpc.aio.AioRpcError,
    legs: str = "prefill",
    times: int = 1,
) -> None:
    """The first ``times`` calls of ``legs`` ("prefill" or "any") fail with ``error``."""
    failed: list[str] = []

    def handler(url: str, request: GenerateRequest) -> Frames:
        if len(failed) < times and (legs == "any" or is_prefill_leg(request)):
            failed.append(url)
            raise error
        return well_behaved(url, request)

    bench.workers.handler = handler


UNAVAILABLE = rpc_error(grpc.StatusCode.UNAVAILABLE, "connection refused")


def prefill_calls(bench: Bench) -> list[tuple[str, str]]:
    calls = bench.workers.calls
    return [(c.url, c.request.request_id) for c in calls if bench.worker(c.url).role == "prefill"]


@pytest.mark.parametrize("dispatch", ["sequential", "parallel"])
async def test_a_prefill_that_fails_to_start_is_retried_on_the_other_prefill(
    model: ModelHandle, dispatch: str
) -> None:
    bench = await pd_bench(model, prefill=(PREFILL_A, PREFILL_B), pd_dispatch=dispatch)
    fail_first(bench, UNAVAILABLE)
    ctx = await bench.context()

    await drain(await bench.open(ctx))

    (first, first_id), (second, second_id) = prefill_calls(bench)
    assert {first, second} == {PREFILL_A, PREFILL_B}
    # A fresh id: the Abort the failed try may have left behind must not end the retry.
    assert (first_id, second_id) == (REQUEST_ID, f"{REQUEST_ID}-retry1")
    assert bench.workers.calls_to(DECODE_A)[-1].request.request_id == f"{REQUEST_ID}-retry1"
    assert bench.failures(first) == 1  # the leg at fault, and only it
    assert bench.failures(second) == 0 and bench.failures(DECODE_A) == 0
    assert set(bench.in_flight().values()) == {0}


@pytest.mark.parametrize("max_retries", [0, 1, 2])
async def test_at_most_max_retries(model: ModelHandle, max_retries: int) -> None:
    bench = await pd_bench(
        model, prefill=(PREFILL_A, PREFILL_B, PREFILL_C), max_retries=max_retries
    )
    fail_first(bench, UNAVAILABLE, times=10)
    ctx = await bench.context()

    with pytest.raises(TandemError) as caught:
        await bench.open(ctx)

    assert caught.value.code == "prefill_worker_failed_to_start"
    calls = prefill_calls(bench)
    assert [rid for _, rid in calls] == [REQUEST_ID] + [
        f"{REQUEST_ID}-retry{i}" for i in range(1, max_retries + 1)
    ]
    assert len({url for url, _ in calls}) == len(calls)  # each try on another prefill
    assert bench.workers.calls_to(DECODE_A) == []
    assert set(bench.in_flight().values()) == {0}


async def test_an_image_request_whose_pixels_were_sent_is_not_retried(model: ModelHandle) -> None:
    bench = await pd_bench(model, prefill=(PREFILL_A, PREFILL_B))
    fail_first(bench, UNAVAILABLE)
    ctx = await bench.context(images=1)
    assert ctx.had_pixels

    with pytest.raises(TandemError) as caught:
        await bench.open(ctx)

    assert caught.value.code == "prefill_worker_failed_to_start"
    assert len(prefill_calls(bench)) == 1  # the pixels left with it: nothing to resend
    assert bench.workers.calls[0].pixels is not None


@pytest.mark.parametrize(
    "error,status",
    [
        (rpc_error(grpc.StatusCode.INVALID_ARGUMENT, "bad request"), 400),
        # A worker bug, named by the worker: another worker would fail alike.
        (rpc_error(grpc.StatusCode.UNAVAILABLE, "boom", worker_code="internal_error"), 503),
    ],
    ids=["client_error", "worker_says_not_retryable"],
)
async def test_a_non_retryable_failure_is_not_retried(
    model: ModelHandle, error: grpc.aio.AioRpcError, status: int
) -> None:
    bench = await pd_bench(model, prefill=(PREFILL_A, PREFILL_B))
    fail_first(bench, error)
    ctx = await bench.context()

    with pytest.raises(TandemError) as caught:
        await bench.open(ctx)

    assert caught.value.status == status and not caught.value.retryable
    assert len(prefill_calls(bench)) == 1
    ((url, _),) = prefill_calls(bench)
    assert bench.failures(url) == (1 if status >= 500 else 0)  # a 4xx is no worker's fault


async def test_a_decode_that_fails_to_start_is_not_retried(model: ModelHandle) -> None:
    """Its prefill ran: the KV it left behind is on that worker, not elsewhere."""
    bench = await pd_bench(model, prefill=(PREFILL_A, PREFILL_B), decode=(DECODE_A, DECODE_B))

    def handler(url: str, request: GenerateRequest) -> Frames:
        if not is_prefill_leg(request):
            raise UNAVAILABLE
        return well_behaved(url, request)

    bench.workers.handler = handler
    ctx = await bench.context()

    with pytest.raises(TandemError) as caught:
        await bench.open(ctx)

    assert caught.value.code == "decode_worker_failed_to_start"
    assert len(prefill_calls(bench)) == 1 and len(bench.workers.calls) == 2
    assert len(bench.workers.releases) == 1


async def test_aggregated_retry_goes_to_the_other_worker(model: ModelHandle) -> None:
    bench = await aggregated_bench(model)
    fail_first(bench, UNAVAILABLE, legs="any")
    ctx = await bench.context()

    frames = await drain(await bench.open(ctx))

    (first, second) = bench.workers.calls
    assert {first.url, second.url} == {REGULAR_A, REGULAR_B}
    assert first.request.request_id == REQUEST_ID
    assert second.request.request_id == f"{REQUEST_ID}-retry1"
    assert first.request.kv_transfer_params_json == ""  # aggregated: no PD tagging
    assert bench.failures(first.url) == 1 and bench.failures(second.url) == 0
    assert frames and set(bench.in_flight().values()) == {0}


@pytest.mark.parametrize("images,max_retries", [(1, 2), (0, 0)], ids=["image", "no_retries"])
async def test_aggregated_no_retry(model: ModelHandle, images: int, max_retries: int) -> None:
    bench = await aggregated_bench(model, max_retries=max_retries)
    fail_first(bench, UNAVAILABLE, legs="any")
    ctx = await bench.context(images=images)

    with pytest.raises(TandemError) as caught:
        await bench.open(ctx)

    assert caught.value.code == "worker_error" and caught.value.status == 503
    assert len(bench.workers.calls) == 1


async def test_aggregated_without_a_worker_fails_at_once(model: ModelHandle) -> None:
    bench = await aggregated_bench(model)
    for worker in bench.registry.workers():
        worker.healthy = False
    ctx = await bench.context()

    with pytest.raises(TandemError) as caught:
        await bench.open(ctx)

    assert caught.value.code == "no_available_workers"
    assert ctx.wire is not None and ctx.wire.request_id == REQUEST_ID  # no retry was made
