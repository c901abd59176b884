"""Fan-out of a parallel text request with n > 1 (gateway/backends/vllm/fanout.py, dispatcher.py).

Scripted workers (fake_worker_client.py) answer each sub-request with tokens of its own,
so the merged stream shows which pair every frame came from.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from dispatch_bench import (
    DECODE_A,
    DECODE_B,
    PREFILL_A,
    PREFILL_B,
    REQUEST_ID,
    drain,
    pd_bench,
    wait_until,
)
from fake_worker_scripts import (
    Frames,
    decode_answer,
    decode_tokens,
    held,
    is_prefill_leg,
    request_kv,
    rpc_error,
    well_behaved,
)

from tandem.errors import TandemError
from tandem.gateway.model import ModelHandle
from tandem.wire.proto import GenerateRequest


async def test_n2_makes_two_pairs_with_ids_seeds_and_restamped_frames(model: ModelHandle) -> None:
    bench = await pd_bench(
        model, prefill=(PREFILL_A, PREFILL_B), decode=(DECODE_A, DECODE_B), pd_dispatch="parallel"
    )
    ctx = await bench.context(n=2, seed=7, temperature=1.0)
    assert ctx.wire is not None
    asked = ctx.wire.SerializeToString(deterministic=True)

    frames = await drain(await bench.open(ctx))

    calls = bench.workers.calls
    prefills = {c.request.request_id: c.request for c in calls if is_prefill_leg(c.request)}
    decodes = {c.request.request_id: c.request for c in calls if not is_prefill_leg(c.request)}
    ids = [f"{REQUEST_ID}-0", f"{REQUEST_ID}-1"]
    assert sorted(prefills) == ids and sorted(decodes) == ids
    for i, rid in enumerate(ids):
        sub = decodes[rid]
        assert sub.sampling_params.n == 1 and sub.sampling_params.seed == 7 + i
        assert prefills[rid].sampling_params.seed == 7 + i
        # Each pair meets at its own minted transfer id.
        assert request_kv(sub)["transfer_id"] == request_kv(prefills[rid])["transfer_id"]
    assert request_kv(decodes[ids[0]])["transfer_id"] != request_kv(decodes[ids[1]])["transfer_id"]

    # Every worker answered as sample 0; the merged stream says which sample it is.
    by_index = {f.index: list(f.token_ids) for f in frames if not f.final}
    assert by_index == {i: decode_tokens(decodes[rid]) for i, rid in enumerate(ids)}
    assert sorted(f.index for f in frames if f.final) == [0, 1]
    assert ctx.wire.SerializeToString(deterministic=True) == asked
    assert bench.workers.aborts == [] and set(bench.in_flight().values()) == {0}


async def test_the_first_failing_sub_request_fails_them_all(model: ModelHandle) -> None:
    bench = await pd_bench(model, pd_dispatch="parallel")
    pulled = asyncio.Event()

    def handler(url: str, request: GenerateRequest) -> Frames:
        if is_prefill_leg(request):
            return well_behaved(url, request)
        if request.request_id.endswith("-1"):
            raise rpc_error(grpc.StatusCode.UNAVAILABLE, "decode worker is down")
        return held(pulled.wait(), decode_answer(request))  # still pulling its KV

    bench.workers.handler = handler
    ctx = await bench.context(n=2, temperature=1.0)

    async with asyncio.timeout(5):
        with pytest.raises(TandemError) as caught:
            await bench.open(ctx)

    assert caught.value.code == "decode_worker_failed_to_start"
    minted = {
        c.request.request_id: request_kv(c.request)["transfer_id"]
        for c in bench.workers.calls
        if is_prefill_leg(c.request)
    }
    # Both prefills' KV is freed: one decode failed, the other was abandoned (the
    # cancelled sibling cleans up on its own, just after the error is returned).
    await wait_until(lambda: len(bench.workers.releases) == 2)
    assert sorted(bench.workers.releases) == sorted((PREFILL_A, t) for t in minted.values())
    assert set(bench.in_flight().values()) == {0}
    pulled.set()  # the abandoned decode leg is aborted once its pull is over
    await wait_until(lambda: bench.workers.aborts != [])
    assert bench.workers.aborts == [(DECODE_A, f"{REQUEST_ID}-0")]
