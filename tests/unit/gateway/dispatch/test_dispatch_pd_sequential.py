"""Sequential PD dispatch (gateway/backends/vllm/pd_sequential.py) over scripted workers.

The workers are fakes (fake_worker_client.py): only they can fail or stall one leg at a
chosen moment. The real-process tests in tests/integration/test_pd_gateway.py run the
same flows end to end.
"""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
from dispatch_bench import DECODE_A, PREFILL_A, REQUEST_ID, Bench, drain, pd_bench, wait_until
from fake_worker_client import WorkerInfo
from fake_worker_scripts import (
    complete,
    decode_answer,
    decode_tokens,
    held,
    rpc_error,
    tandem_export,
)

from tandem.errors import TandemError
from tandem.gateway.model import ModelHandle
from tandem.wire.proto import GenerateRequest, MediaIdentity, Modality, pb

PREFILL_TAG = '{"do_remote_decode":true,"do_remote_prefill":false}'
CONNECTORS = [WorkerInfo.tandem(), WorkerInfo.vllm_nixl()]


def snapshot(ctx_wire: GenerateRequest | None) -> bytes:
    assert ctx_wire is not None
    return ctx_wire.SerializeToString(deterministic=True)


@pytest.mark.parametrize("info", CONNECTORS, ids=lambda i: i.kv_connector)
async def test_prefill_leg_is_a_sanitized_copy_and_decode_gets_its_kv_verbatim(
    model: ModelHandle, info: WorkerInfo
) -> None:
    bench = await pd_bench(model, info=info)
    ctx = await bench.context(
        stream=True, max_tokens=8, min_tokens=2, stop_token_ids=[5], seed=3, temperature=0.5
    )
    assert ctx.wire is not None
    ctx.wire.sampling_params.stop.append("never")  # a stop string on the wire, as vLLM's
    asked = snapshot(ctx.wire)

    frames = await drain(await bench.open(ctx))

    prefill = bench.only_call(PREFILL_A).request
    params = prefill.sampling_params
    assert prefill.request_id == REQUEST_ID
    assert (params.max_tokens, params.min_tokens, params.n) == (1, 0, 1)
    assert list(params.stop) == [] and list(params.stop_token_ids) == []
    assert params.ignore_eos is True and prefill.stream is False
    assert (params.seed, params.temperature) == (3, 0.5)  # the rest is the client's
    assert prefill.kv_transfer_params_json == PREFILL_TAG

    decode = bench.only_call(DECODE_A).request
    assert decode.request_id == REQUEST_ID
    assert decode.kv_transfer_params_json == tandem_export(PREFILL_A, prefill)  # verbatim
    assert not decode.HasField("kv_transfer_params")
    assert decode.sampling_params.max_tokens == 8 and decode.stream is True
    assert list(decode.sampling_params.stop_token_ids) == [5]
    assert list(decode.tokenized.input_ids) == list(ctx.wire.tokenized.input_ids)

    assert snapshot(ctx.wire) == asked  # what the client asked for, untouched
    assert [f.token_ids for f in frames if not f.final] == [decode_tokens(decode)]
    assert bench.workers.aborts == [] and bench.workers.releases == []
    assert set(bench.in_flight().values()) == {0}


async def test_image_pixels_go_with_the_prefill_leg_only(model: ModelHandle) -> None:
    bench = await pd_bench(model)
    ctx = await bench.context(images=1)
    assert ctx.pixels is not None and ctx.wire is not None
    shape, asked = ctx.pixels.shape, snapshot(ctx.wire)

    await drain(await bench.open(ctx))

    prefill, decode = bench.only_call(PREFILL_A), bench.only_call(DECODE_A)
    assert prefill.pixels is not None and prefill.pixels.shape == shape
    assert decode.pixels is None
    assert decode.request.HasField("mm_inputs")  # the identity: hashes, placeholders, grids
    assert not decode.request.mm_inputs.HasField("pixel_values")
    assert decode.request.kv_transfer_params_json == tandem_export(PREFILL_A, prefill.request)
    assert ctx.pixels is None  # sent: the gateway keeps no copy
    assert snapshot(ctx.wire) == asked


def _identity_of(request: GenerateRequest) -> MediaIdentity:
    """What a Tandem prefill worker that processed the refs sends back: expanded ids."""
    identity = MediaIdentity()
    identity.prompt_token_ids.extend([*request.tokenized.input_ids, 900, 901, 902])
    identity.mm_inputs.mm_hashes.append("hash-of-image-0")
    identity.mm_inputs.mm_placeholders.add(offset=len(request.tokenized.input_ids), length=3)
    identity.mm_inputs.modality = Modality.IMAGE
    return identity


async def test_worker_path_decode_leg_gets_the_prefill_identity(model: ModelHandle) -> None:
    bench = await pd_bench(model, mm_processing="worker")
    seen: dict[str, MediaIdentity] = {}

    def prefill(url: str, request: GenerateRequest) -> list[pb.GenerateResponse]:
        seen["identity"] = _identity_of(request)
        return [complete(kv_json=tandem_export(url, request), identity=seen["identity"])]

    bench.workers.handlers[PREFILL_A] = prefill
    ctx = await bench.context(images=1)
    assert ctx.mm_path == "worker" and ctx.pixels is None

    await drain(await bench.open(ctx))

    prefill_leg, decode_leg = bench.only_call(PREFILL_A).request, bench.only_call(DECODE_A).request
    assert prefill_leg.HasField("media_refs")
    assert not decode_leg.HasField("media_refs")  # not fetched and processed a second time
    identity = seen["identity"]
    assert list(decode_leg.tokenized.input_ids) == list(identity.prompt_token_ids)
    assert decode_leg.mm_inputs == identity.mm_inputs


async def test_worker_path_decode_leg_keeps_its_refs_without_an_identity(
    model: ModelHandle,
) -> None:
    bench = await pd_bench(model, mm_processing="worker")
    ctx = await bench.context(images=1)
    await drain(await bench.open(ctx))
    decode_leg = bench.only_call(DECODE_A).request
    assert decode_leg.HasField("media_refs")  # its worker processes the media itself
    assert decode_leg.kv_transfer_params_json


@pytest.mark.parametrize("info", CONNECTORS, ids=lambda i: i.kv_connector)
async def test_decode_failing_to_start_releases_the_prefill_kv(
    model: ModelHandle, info: WorkerInfo
) -> None:
    bench = await pd_bench(model, info=info)

    def decode(url: str, request: GenerateRequest) -> list[pb.GenerateResponse]:
        raise rpc_error(grpc.StatusCode.UNAVAILABLE, "decode worker is down")

    bench.workers.handlers[DECODE_A] = decode
    ctx = await bench.context()

    with pytest.raises(TandemError) as caught:
        await bench.open(ctx)

    assert caught.value.code == "decode_worker_failed_to_start"
    assert caught.value.status == 503 and caught.value.leg == "decode"
    held_kv = json.loads(tandem_export(PREFILL_A, bench.only_call(PREFILL_A).request))
    # Only a Tandem prefill worker has a release call; NIXL's KV waits for its timeout.
    expected = (
        [(PREFILL_A, held_kv["transfer_id"])] if info.kv_connector == "TandemConnector" else []
    )
    assert bench.workers.releases == expected
    assert (bench.failures(PREFILL_A), bench.failures(DECODE_A)) == (0, 1)  # the leg at fault
    assert set(bench.in_flight().values()) == {0}


async def test_a_failed_release_leaves_the_answer_as_it_was(model: ModelHandle) -> None:
    """Release is best effort: the client gets the decode leg's error, not the release's."""
    bench = await pd_bench(model)
    bench.workers.release_error = rpc_error(grpc.StatusCode.UNAVAILABLE, "prefill went away")

    def decode(url: str, request: GenerateRequest) -> list[pb.GenerateResponse]:
        raise rpc_error(grpc.StatusCode.UNAVAILABLE, "decode worker is down")

    bench.workers.handlers[DECODE_A] = decode
    ctx = await bench.context()

    with pytest.raises(TandemError) as caught:
        await bench.open(ctx)

    assert caught.value.code == "decode_worker_failed_to_start"
    assert len(bench.workers.releases) == 1


async def test_prefill_without_kv_for_an_image_is_charged_to_prefill(model: ModelHandle) -> None:
    """An image decode leg without pixels and without KV would answer image-blind: 502."""
    bench = await pd_bench(model)
    bench.workers.handlers[PREFILL_A] = lambda url, request: [complete()]  # no KV params
    ctx = await bench.context(images=1)

    with pytest.raises(TandemError) as caught:
        await bench.open(ctx)

    assert caught.value.code == "pd_decode_missing_kv_transfer_params"
    assert bench.workers.calls_to(DECODE_A) == []  # never sent
    assert (bench.failures(PREFILL_A), bench.failures(DECODE_A)) == (1, 0)


async def test_client_leaving_during_the_kv_pull_defers_the_decode_abort(
    model: ModelHandle,
) -> None:
    bench = await pd_bench(model)
    pulled = asyncio.Event()  # the decode worker's KV pull is over: its first frame comes
    bench.workers.handlers[DECODE_A] = lambda url, request: held(
        pulled.wait(), decode_answer(request)
    )
    ctx = await bench.context()
    opening = asyncio.ensure_future(bench.open(ctx))
    await wait_until(lambda: _decode_reading(bench))

    opening.cancel()  # the client hangs up
    with pytest.raises(asyncio.CancelledError):
        await opening

    held_kv = json.loads(tandem_export(PREFILL_A, bench.only_call(PREFILL_A).request))
    assert bench.workers.releases == [(PREFILL_A, held_kv["transfer_id"])]  # freed at once
    assert bench.workers.aborts == []  # not aborted in the middle of its pull
    assert set(bench.in_flight().values()) == {0}

    pulled.set()
    await wait_until(lambda: bench.workers.aborts != [])
    assert bench.workers.aborts == [(DECODE_A, REQUEST_ID)]  # then dropped (Abort)


def _decode_reading(bench: Bench) -> bool:
    calls = bench.workers.calls_to(DECODE_A)
    return bool(calls) and calls[0].stream.reading


async def test_sequential_n2_is_one_pair_without_kv_handoff(model: ModelHandle) -> None:
    """n > 1: the KV handoff has one consumer, so decode recomputes the prompt itself."""
    bench = await pd_bench(model)
    ctx = await bench.context(n=2, temperature=1.0)
    frames = await drain(await bench.open(ctx))

    prefill, decode = bench.only_call(PREFILL_A).request, bench.only_call(DECODE_A).request
    assert prefill.kv_transfer_params_json == "" and prefill.sampling_params.n == 1
    assert decode.kv_transfer_params_json == "" and decode.sampling_params.n == 2
    assert sorted(f.index for f in frames if f.final) == [0, 1]
