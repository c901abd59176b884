"""`tandem worker --protocol tokenspeed`: real worker processes, real forward passes.

Every worker here is a real `tandem worker` process on 127.0.0.1; the requests are what a
TokenSpeed gateway sends (one item per image with its own router-side pixel rows, every
sampling scalar present, PD legs with the same request id and ``kv_bootstrap_info`` sent at
the same time, the decode leg's items without pixels). Greedy answers are compared with the
SGLang adapter's over the same engine, and PD answers with aggregated ones; the KV really
moves between processes over the side channel.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import grpc
import pytest
from smg_grpc_proto.generated import common_pb2

from tandem.engine.builtin_shapes import draw
from tandem.errors import WORKER_ERROR_CODE_KEY
from tandem.wire.tokenspeed import tpb, tpb_grpc

from .processes import Proc, start_all
from .wire_helpers import stats
from .worker_sglang_helpers import generate as sglang_generate
from .worker_sglang_helpers import prompt, sglang_request, text_of
from .worker_tokenspeed_helpers import (
    call,
    decode_leg,
    generate,
    tokenspeed_request,
    with_room,
)

MODELS = {"qwen": "tiny-qwen3-vl", "llava": "tiny-llava-1.5"}
PULL_WAIT_S = 3.0  # the decode workers' --kv-pull-wait-secs


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


BOOTSTRAP_PORT = _free_port()  # qwen's prefill worker listens here too
TS = ["--protocol", "tokenspeed"]
DECODE = ["--role", "decode", "--kv-pull-wait-secs", str(PULL_WAIT_S)]
WORKERS = {
    "qwen-ts": ["--model", MODELS["qwen"], *TS],
    "qwen-sgl": ["--model", MODELS["qwen"], "--protocol", "sglang"],
    "qwen-prefill": [
        *("--model", MODELS["qwen"], *TS, "--role", "prefill"),
        *("--disaggregation-bootstrap-port", str(BOOTSTRAP_PORT)),
    ],
    "qwen-decode": ["--model", MODELS["qwen"], *TS, *DECODE],
    "qwen-encode": ["--model", MODELS["qwen"], *TS, "--role", "encode"],
    "llava-ts": ["--model", MODELS["llava"], *TS],
    "llava-sgl": ["--model", MODELS["llava"], "--protocol", "sglang"],
    "llava-prefill": ["--model", MODELS["llava"], *TS, "--role", "prefill"],
    "llava-decode": ["--model", MODELS["llava"], *TS, *DECODE],
    "llava-lmo": ["--model", MODELS["llava"], *TS, *DECODE, "--language-model-only"],
}


@pytest.fixture(scope="module")
def workers(model_cache: Path):
    procs = start_all([["worker", *args] for args in WORKERS.values()])
    yield dict(zip(WORKERS, procs, strict=True))
    for proc in procs:
        proc.stop()


def model_dir(family: str) -> Path:
    from tandem.engine.builtin import resolve_model

    return resolve_model(MODELS[family])


def pictures(n: int, seed: int = 0) -> list:
    """``n`` distinct images (seeded noise, as the other worker tests use)."""
    import base64
    import io

    from PIL import Image

    from .wire_helpers import image_data_url

    images = []
    for k in range(n):
        data = image_data_url(seed + k).split(",", 1)[1]
        images.append(Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB"))
    return images


def bootstrap_of(workers: dict[str, Proc], family: str) -> tuple[str, int]:
    """Where a decode worker reaches the family's prefill worker's KV."""
    if family == "qwen":
        return "127.0.0.1", BOOTSTRAP_PORT
    host, port = workers[f"{family}-prefill"].address.rsplit(":", 1)
    return host, int(port)


async def run_pd(
    workers: dict[str, Proc], family: str, req: tpb.GenerateRequest, room: int, decode: str = ""
):
    """Both legs at once, as TokenSpeed gateways send them; (prefill, decode) outcomes."""
    host, port = bootstrap_of(workers, family)
    prefill_leg = with_room(req, host, port, room)
    return await asyncio.gather(
        generate(workers[f"{family}-prefill"].address, prefill_leg),
        generate(workers[decode or f"{family}-decode"].address, decode_leg(prefill_leg)),
    )


@pytest.mark.parametrize("family", ["qwen", "llava"])
@pytest.mark.parametrize("n_images", [0, 1, 2])
async def test_the_tokenspeed_adapter_answers_as_the_sglang_adapter(
    workers, family, n_images
) -> None:
    p = prompt(model_dir(family), "What is in the picture?", pictures(n_images))
    ts = await generate(workers[f"{family}-ts"].address, tokenspeed_request("eq", p))
    sgl = await sglang_generate(workers[f"{family}-sgl"].address, sglang_request("eq", p))
    assert len(ts.tokens) >= 1
    assert ts.tokens == sgl.tokens
    assert ts.request_ids == {"eq"}
    done = ts.completes[0]
    assert (done.prompt_tokens, done.completion_tokens) == (len(p.ids), len(sgl.tokens))


@pytest.mark.parametrize("family", ["qwen", "llava"])
@pytest.mark.parametrize("n_images", [0, 1, 2])
async def test_pd_over_a_room_matches_aggregated(workers, family, n_images) -> None:
    p = prompt(model_dir(family), "What is in the picture?", pictures(n_images, seed=20))
    req = tokenspeed_request(f"pd-{family}-{n_images}", p, stream=True)
    aggregated = await generate(workers[f"{family}-ts"].address, req)
    before = await stats(workers[f"{family}-decode"].address)
    room = (1 << 62) + n_images  # rooms are 63-bit
    prefill, decode = await run_pd(workers, family, req, room=room)
    assert decode.tokens == aggregated.tokens
    assert len(prefill.completes) == 1 and len(prefill.completes[0].output_ids) <= 1
    decode_stats = await stats(workers[f"{family}-decode"].address)
    computed = decode_stats["prefill_computed_tokens"] - before["prefill_computed_tokens"]
    assert computed == 1, "the decode worker recomputes the last prompt position only"
    assert decode_stats["leg_bytes"]["decode"]["pixel_bytes"] == 0
    prefill_stats = await stats(workers[f"{family}-prefill"].address)
    assert prefill_stats["held_transfers"] == 0, "the pull released the prefill's KV"
    if n_images:
        assert prefill_stats["leg_bytes"]["prefill"]["pixel_bytes"] > 0


@pytest.mark.parametrize("n_images", [1, 2])
async def test_a_language_model_only_decode_worker_takes_image_legs(workers, n_images) -> None:
    p = prompt(model_dir("llava"), "Describe it.", pictures(n_images, seed=40))
    req = tokenspeed_request(f"lmo-{n_images}", p)
    aggregated = await generate(workers["llava-ts"].address, req)
    _, decode = await run_pd(workers, "llava", req, room=400 + n_images, decode="llava-lmo")
    assert decode.tokens == aggregated.tokens


@pytest.mark.parametrize("family", ["qwen", "llava"])
async def test_red_and_blue_pictures_are_told_apart_through_pd(workers, family) -> None:
    """The same text behind a red, a blue, then the red picture (same size, same token
    count): items keyed by anything but their own pixels would answer one picture's KV
    (or prefix cache) for the other. The gateway's content_hash is the same for all three
    (the helper writes it by position), and must not matter."""
    for k, colour in enumerate(("red", "blue", "red")):
        image = draw(colour, "circle", (128, 128)).image
        p = prompt(model_dir(family), "What is in this picture?", [image])
        req = tokenspeed_request(f"colour-{family}-{k}", p, max_new_tokens=20)
        aggregated = await generate(workers[f"{family}-ts"].address, req)
        _, decode = await run_pd(workers, family, req, room=1000 + k)
        assert text_of(model_dir(family), aggregated.tokens) == f"a {colour} circle"
        assert decode.tokens == aggregated.tokens, colour


async def test_a_decode_leg_does_not_run_vision_on_pixels_it_carries(workers) -> None:
    p = prompt(model_dir("qwen"), "What is in the picture?", pictures(1, seed=50))
    req = tokenspeed_request("decode-pixels", p)
    aggregated = await generate(workers["qwen-ts"].address, req)
    host, port = bootstrap_of(workers, "qwen")
    leg = with_room(req, host, port, 50)
    before = await stats(workers["qwen-decode"].address)
    _, decode = await asyncio.gather(
        generate(workers["qwen-prefill"].address, leg),
        generate(workers["qwen-decode"].address, leg),  # the pixels left in
    )
    assert decode.tokens == aggregated.tokens
    after = await stats(workers["qwen-decode"].address)
    assert after.get("vision_encodes", 0) == before.get("vision_encodes", 0)
    assert after["prefill_computed_tokens"] - before["prefill_computed_tokens"] == 1


async def test_a_decode_leg_with_other_items_than_its_prefill_is_refused(workers) -> None:
    p = prompt(model_dir("llava"), "Count them.", pictures(2, seed=60))
    host, port = bootstrap_of(workers, "llava")
    leg = with_room(tokenspeed_request("count", p), host, port, 600)
    await generate(workers["llava-prefill"].address, leg)
    assert (await stats(workers["llava-prefill"].address))["held_transfers"] == 1
    bad = decode_leg(leg)
    del bad.mm_inputs.items[1]
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await generate(workers["llava-decode"].address, bad)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "carries 1 mm_inputs item(s) but its prefill holds KV for 2" in (
        info.value.details() or ""
    )
    assert (await stats(workers["llava-prefill"].address))["held_transfers"] == 0


def _refused(case: str) -> tuple[tpb.GenerateRequest, str, str]:
    """(the request, the message's words, the worker error code or "")."""
    image = prompt(model_dir("qwen"), "Refuse me.", pictures(1))
    req = tokenspeed_request(f"refuse-{case}", image)
    if case == "stop":
        req.sampling_params.stop.append("\n")
        return req, "sampling_params.stop", "unsupported_parameter"
    if case == "no_items":
        req.ClearField("mm_inputs")
        return req, "no mm_inputs.items", ""
    if case == "no_pixels":
        req.mm_inputs.items[0].ClearField("encoder_input")
        return req, "items[0] has no encoder_input", ""
    if case == "epd":
        req.encode_bootstrap_info.items.add(item_index=0, bootstrap_host="127.0.0.1")
        return req, "carries its own encoder_input", ""
    if case == "room":
        return with_room(req, "127.0.0.1", BOOTSTRAP_PORT, 5), "not disaggregated", ""
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["stop", "no_items", "no_pixels", "epd", "room"])
async def test_refusals_are_invalid_argument(workers, case: str) -> None:
    req, words, code = _refused(case)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await generate(workers["qwen-ts"].address, req)
    err = info.value
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
    assert words in (err.details() or "")
    assert dict(err.trailing_metadata() or ()).get(WORKER_ERROR_CODE_KEY, "") == code


async def test_streams_logprobs_and_samples_follow_tokenspeed_semantics(workers) -> None:
    p = prompt(model_dir("llava"), "Describe it.", pictures(1, seed=80))
    req = tokenspeed_request("lp", p, 6)
    req.return_logprob, req.top_logprobs_num = True, 3
    whole = await generate(workers["llava-ts"].address, req)
    req.stream = True
    streamed = await generate(workers["llava-ts"].address, req)
    assert streamed.tokens == whole.tokens
    assert [c.completion_tokens for c in streamed.chunks] == list(range(1, len(whole.tokens) + 1))
    assert list(streamed.completes[0].output_ids) == list(streamed.chunks[-1].token_ids)
    reference = sglang_request("lp", p, 6)
    reference.return_logprob, reference.top_logprobs_num = True, 3
    sgl = (await sglang_generate(workers["llava-sgl"].address, reference)).completes[0]
    wire = whole.completes[0].output_logprobs
    assert list(wire.token_ids) == list(sgl.output_logprobs.token_ids) == whole.tokens
    assert list(wire.token_logprobs) == pytest.approx(list(sgl.output_logprobs.token_logprobs))
    assert [len(t.values) for t in wire.top_logprobs] == [3] * len(whole.tokens)
    per_chunk = [t for c in streamed.chunks for t in c.output_logprobs.token_ids]
    assert per_chunk == whole.tokens
    req.top_logprobs_num = 0  # every position still has its (empty) TopLogProbs
    bare = (await generate(workers["llava-ts"].address, req)).chunks
    assert all(len(c.output_logprobs.top_logprobs) == len(c.token_ids) for c in bare)
    text = prompt(model_dir("qwen"), "Say something.")
    two = tokenspeed_request("n2", text, 6, stream=True, temperature=1.0, n=2, ignore_eos=True)
    two.sampling_params.sampling_seed = 7
    out = await generate(workers["qwen-ts"].address, two)
    again = await generate(workers["qwen-ts"].address, two)
    assert {c.index for c in out.chunks} == {0, 1}
    assert sorted(c.index for c in out.completes) == [0, 1]
    assert [out.streamed(i) for i in (0, 1)] == [again.streamed(i) for i in (0, 1)], "seeded"
    assert all(c.finish_reason == "length" and c.completion_tokens == 6 for c in out.completes)


async def test_an_encode_worker_is_discoverable_and_generates_nothing(workers) -> None:
    address = workers["qwen-encode"].address
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await generate(address, tokenspeed_request("e", prompt(model_dir("qwen"), "hi")))
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert info.value.details() == "Generate is unavailable on TokenSpeed encode workers"
    assert list((await call(address, "GetLoads", tpb.GetLoadsRequest())).loads) == []
    health = await call(address, "HealthCheck", tpb.HealthCheckRequest())
    assert health.healthy and "shallow probe" in health.message
    server = await call(address, "GetServerInfo", tpb.GetServerInfoRequest())
    assert dict(server.server_args.items())["disaggregation_mode"] == "encode"


async def test_info_calls_describe_the_worker(workers) -> None:
    prefill = workers["qwen-prefill"].address
    async with grpc.aio.insecure_channel(prefill) as channel:
        stub = tpb_grpc.TokenSpeedSchedulerStub(channel)
        server_call = stub.GetServerInfo(tpb.GetServerInfoRequest(), timeout=10)
        server = await server_call
        assert dict(await server_call.trailing_metadata()).get("tandem-worker")
        args = dict(server.server_args.items())
        assert args["disaggregation_mode"] == "prefill"
        assert int(args["disaggregation_bootstrap_port"]) == BOOTSTRAP_PORT
        assert args["served_model_name"] == MODELS["qwen"] and int(args["tp_size"]) == 1
        assert server.tokenspeed_version.startswith("tandem-")
        loads = await stub.GetLoads(tpb.GetLoadsRequest(include=["core"]), timeout=10)
        assert loads.dp_rank_count == 1 and loads.loads[0].dp_rank == 0
        health = await stub.HealthCheck(tpb.HealthCheckRequest(), timeout=10)
        assert health.healthy and "shallow probe" in health.message
        chunks = [c async for c in stub.GetTokenizer(common_pb2.GetTokenizerRequest())]
        assert chunks[-1].sha256 and sum(len(c.data) for c in chunks) > 0
        # A subscriber from sequence 0 gets the snapshot first (docs/worker-protocols.md,
        # "KV events"); the stream then stays open, so the test cancels it.
        events = stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest(), timeout=10)
        first = await events.read()
        assert first.HasField("snapshot") and first.snapshot.index == 0
        events.cancel()
    # The bootstrap port serves the KV side channel (and the same services).
    assert "held_transfers" in await stats(f"127.0.0.1:{BOOTSTRAP_PORT}")
    both = await call(workers["qwen-ts"].address, "GetServerInfo", tpb.GetServerInfoRequest())
    assert dict(both.server_args.items())["disaggregation_mode"] == "null"
    model = await call(workers["qwen-ts"].address, "GetModelInfo", tpb.GetModelInfoRequest())
    assert model.supports_vision and model.multimodal_encoder_dtype == "float32"
    lmo = await call(workers["llava-lmo"].address, "GetModelInfo", tpb.GetModelInfoRequest())
    assert lmo.supports_vision is False and lmo.served_model_name == MODELS["llava"]
    for name in ("qwen-prefill", "qwen-ts", "qwen-decode"):
        assert "Traceback" not in workers[name].output()
