"""`tandem worker --protocol sglang`: real worker processes, real forward passes.

Every worker here is a real `tandem worker` process on 127.0.0.1; the requests are what
an SGLang gateway sends (router-side preprocessed pixels, every sampling number written
out, PD legs with the same request id and bootstrap room sent at the same time). Greedy
answers are compared with the vLLM adapter's over the same engine, and PD answers with
aggregated ones; the KV really moves between processes over the side channel.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import grpc
import pytest
from google.protobuf import struct_pb2
from smg_grpc_proto.generated import common_pb2

from tandem.engine.builtin_shapes import draw
from tandem.errors import WORKER_ERROR_CODE_KEY
from tandem.wire.sglang import spb, spb_grpc

from .gateway_probe import eventually
from .processes import Proc, start_all
from .wire_helpers import generate as vllm_generate
from .wire_helpers import image_data_url, stats
from .worker_sglang_helpers import (
    call,
    decode_leg,
    generate,
    prompt,
    sglang_request,
    text_of,
    vllm_request,
    with_room,
)

MODELS = {"qwen": "tiny-qwen3-vl", "llava": "tiny-llava-1.5"}
PULL_WAIT_S = 3.0  # the decode workers' --kv-pull-wait-secs


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


BOOTSTRAP_PORT = _free_port()  # qwen's prefill worker listens here too
SGL = ["--protocol", "sglang"]
DECODE = ["--role", "decode", "--kv-pull-wait-secs", str(PULL_WAIT_S)]
WORKERS = {
    "qwen-sgl": ["--model", MODELS["qwen"], *SGL],
    "qwen-vllm": ["--model", MODELS["qwen"]],
    "qwen-prefill": [
        *("--model", MODELS["qwen"], *SGL, "--role", "prefill"),
        *("--disaggregation-bootstrap-port", str(BOOTSTRAP_PORT)),
    ],
    "qwen-decode": ["--model", MODELS["qwen"], *SGL, *DECODE],
    "llava-sgl": ["--model", MODELS["llava"], *SGL],
    "llava-vllm": ["--model", MODELS["llava"]],
    "llava-prefill": ["--model", MODELS["llava"], *SGL, "--role", "prefill"],
    "llava-decode": ["--model", MODELS["llava"], *SGL, *DECODE],
    "llava-lmo": ["--model", MODELS["llava"], *SGL, *DECODE, "--language-model-only"],
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
    workers: dict[str, Proc], family: str, req: spb.GenerateRequest, room: int, decode: str = ""
):
    """Both legs at once, as SGLang gateways send them; (prefill, decode) outcomes."""
    host, port = bootstrap_of(workers, family)
    prefill_leg = with_room(req, host, port, room)
    leg = decode_leg(prefill_leg)
    return await asyncio.gather(
        generate(workers[f"{family}-prefill"].address, prefill_leg),
        generate(workers[decode or f"{family}-decode"].address, leg),
    )


@pytest.mark.parametrize("family", ["qwen", "llava"])
@pytest.mark.parametrize("n_images", [0, 1, 2])
async def test_the_sglang_adapter_answers_as_the_vllm_adapter(workers, family, n_images) -> None:
    p = prompt(model_dir(family), "What is in the picture?", pictures(n_images))
    sglang = await generate(workers[f"{family}-sgl"].address, sglang_request("eq", p))
    vllm = await vllm_generate(workers[f"{family}-vllm"].address, vllm_request("eq", p))
    assert len(sglang.tokens) >= 1
    assert sglang.tokens == vllm.tokens
    assert sglang.request_ids == {"eq"}
    done = sglang.completes[0]
    assert (done.prompt_tokens, done.completion_tokens) == (len(p.ids), len(vllm.tokens))


@pytest.mark.parametrize("family", ["qwen", "llava"])
@pytest.mark.parametrize("n_images", [0, 1, 2])
async def test_pd_over_a_room_matches_aggregated(workers, family, n_images) -> None:
    p = prompt(model_dir(family), "What is in the picture?", pictures(n_images, seed=20))
    req = sglang_request(f"pd-{family}-{n_images}", p, stream=True)
    aggregated = await generate(workers[f"{family}-sgl"].address, req)
    before = await stats(workers[f"{family}-decode"].address)
    prefill, decode = await run_pd(workers, family, req, room=n_images)  # room 0 is valid
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
    req = sglang_request(f"lmo-{n_images}", p)
    aggregated = await generate(workers["llava-sgl"].address, req)
    _, decode = await run_pd(workers, "llava", req, room=400 + n_images, decode="llava-lmo")
    assert decode.tokens == aggregated.tokens


@pytest.mark.parametrize("family", ["qwen", "llava"])
async def test_red_and_blue_pictures_are_told_apart_through_pd(workers, family) -> None:
    """The same text behind a red, a blue, then the red picture (same size, same token
    count): a decode leg keyed without the prefill's media items would answer one
    picture's KV (or prefix cache) for the other."""
    for k, colour in enumerate(("red", "blue", "red")):
        image = draw(colour, "circle", (128, 128)).image
        p = prompt(model_dir(family), "What is in this picture?", [image])
        req = sglang_request(f"colour-{family}-{k}", p, max_new_tokens=20)
        aggregated = await generate(workers[f"{family}-sgl"].address, req)
        _, decode = await run_pd(workers, family, req, room=1000 + k)
        assert text_of(model_dir(family), aggregated.tokens) == f"a {colour} circle"
        assert decode.tokens == aggregated.tokens, colour


async def test_a_room_that_never_appears_is_unavailable_in_time(workers) -> None:
    p = prompt(model_dir("qwen"), "Nobody prefilled this.")
    leg = with_room(sglang_request("lonely", p), "127.0.0.1", BOOTSTRAP_PORT, 77)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await generate(workers["qwen-decode"].address, leg)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "could not pull KV from the prefill worker" in (info.value.details() or "")
    assert PULL_WAIT_S - 0.5 <= loop.time() - started < PULL_WAIT_S + 5.0
    reply = await call(workers["qwen-decode"].address, "HealthCheck", spb.HealthCheckRequest())
    assert reply.healthy


def _refusal_cases() -> dict[str, tuple[str, str]]:
    """Name → (the message's words, the worker error code or "")."""
    return {
        "stop": ("sampling_params.stop", "unsupported_parameter"),
        "custom_params": ("custom_params", "unsupported_parameter"),
        "image_urls": ("mm_inputs.image_urls", ""),
        "prompt_logprobs": ("logprob_start_len", "unsupported_parameter"),
        "lora_id": ("lora_id", "unsupported_parameter"),
        "not_disaggregated": ("not disaggregated", ""),
        "image_tokens_without_pixels": ("no mm_inputs.pixel_values", ""),
    }


def _refused_request(case: str) -> spb.GenerateRequest:
    text = prompt(model_dir("qwen"), "Refuse me.")
    req = sglang_request(f"refuse-{case}", text)
    if case == "stop":
        req.sampling_params.stop.append("\n")
    elif case == "custom_params":
        req.sampling_params.custom_params.CopyFrom(struct_pb2.Struct(fields={}))
        req.sampling_params.custom_params.update({"x": 1})
    elif case == "image_urls":
        req.mm_inputs.image_urls.append("https://example.com/a.png")
    elif case == "prompt_logprobs":
        req.return_logprob, req.logprob_start_len = True, 0
    elif case == "lora_id":
        req.lora_id = "adapter"
    elif case == "not_disaggregated":
        req = with_room(req, "127.0.0.1", BOOTSTRAP_PORT, 5)
    elif case == "image_tokens_without_pixels":
        image = prompt(model_dir("qwen"), "Refuse me.", pictures(1))
        req = sglang_request(f"refuse-{case}", image)
        req.mm_inputs.ClearField("pixel_values")  # a pixel-less mm_inputs is ignored
    return req


@pytest.mark.parametrize("case", list(_refusal_cases()))
async def test_refusals_are_invalid_argument(workers, case: str) -> None:
    words, code = _refusal_cases()[case]
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await generate(workers["qwen-sgl"].address, _refused_request(case))
    err = info.value
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
    assert words in (err.details() or "")
    assert dict(err.trailing_metadata() or ()).get(WORKER_ERROR_CODE_KEY, "") == code


async def test_a_language_model_only_worker_refuses_pixels(workers) -> None:
    p = prompt(model_dir("llava"), "Describe it.", pictures(1))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await generate(workers["llava-lmo"].address, sglang_request("lmo-pixels", p))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "--language-model-only" in (info.value.details() or "")


async def test_a_refused_decode_leg_releases_the_prefill_kv(workers) -> None:
    p = prompt(model_dir("llava"), "Release me.", pictures(1, seed=60))
    host, port = bootstrap_of(workers, "llava")
    leg = with_room(sglang_request("refused-decode", p), host, port, 600)
    await generate(workers["llava-prefill"].address, leg)
    assert (await stats(workers["llava-prefill"].address))["held_transfers"] == 1
    bad = decode_leg(leg)
    bad.sampling_params.stop.append("x")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await generate(workers["llava-decode"].address, bad)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (await stats(workers["llava-prefill"].address))["held_transfers"] == 0


async def test_a_decode_leg_refused_before_its_prefill_ran_frees_the_kv_later(workers) -> None:
    """The legs arrive together: a decode leg refused at once cannot release KV that its
    prefill has not stored yet, so the release waits for it (up to the pull wait)."""
    p = prompt(model_dir("llava"), "Release me later.")
    host, port = bootstrap_of(workers, "llava")
    leg = with_room(sglang_request("refused-first", p), host, port, 601)
    bad = decode_leg(leg)
    bad.sampling_params.custom_params.update({"x": 1})
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await generate(workers["llava-decode"].address, bad)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    await generate(workers["llava-prefill"].address, leg)

    async def released() -> bool:
        return (await stats(workers["llava-prefill"].address))["held_transfers"] == 0

    await eventually(released, timeout=PULL_WAIT_S + 1.0)


async def test_an_empty_bootstrap_host_is_refused(workers) -> None:
    leg = with_room(sglang_request("no-host", prompt(model_dir("qwen"), "hi")), "", 1, 1)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await generate(workers["qwen-decode"].address, leg)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "bootstrap_host" in (info.value.details() or "")


async def test_streams_and_completes_follow_sglang_semantics(workers) -> None:
    p = prompt(model_dir("qwen"), "What is in the picture?", pictures(1, seed=70))
    whole = await generate(workers["qwen-sgl"].address, sglang_request("whole", p, 20))
    streamed = await generate(
        workers["qwen-sgl"].address, sglang_request("streamed", p, 20, stream=True)
    )
    assert streamed.tokens == whole.tokens
    counts = [c.completion_tokens for c in streamed.chunks]
    assert counts == list(range(1, len(whole.tokens) + 1)), "counts are cumulative"
    assert {c.prompt_tokens for c in streamed.chunks} == {len(p.ids)}
    done = streamed.completes[0]
    assert list(done.output_ids) == list(streamed.chunks[-1].token_ids)
    assert done.completion_tokens == len(whole.tokens)
    final = whole.completes[0]
    if final.finish_reason == "stop":  # the trained model ends with its eos token
        assert final.WhichOneof("matched_stop") == "matched_token_id"
        assert final.matched_token_id == final.output_ids[-1]
    else:
        assert final.WhichOneof("matched_stop") is None


async def test_logprobs_match_the_vllm_adapter(workers) -> None:
    p = prompt(model_dir("llava"), "Describe it.", pictures(1, seed=80))
    req = sglang_request("lp", p, 6)
    req.return_logprob, req.top_logprobs_num = True, 3
    whole = await generate(workers["llava-sgl"].address, req)
    req.stream = True
    streamed = await generate(workers["llava-sgl"].address, req)
    reference = vllm_request("lp", p, 6)
    reference.sampling_params.logprobs = 3
    vllm = (await vllm_generate(workers["llava-vllm"].address, reference)).complete
    wire = whole.completes[0].output_logprobs
    assert list(wire.token_ids) == list(vllm.output_logprobs.token_ids) == whole.tokens
    assert list(wire.token_logprobs) == pytest.approx(list(vllm.output_logprobs.token_logprobs))
    assert [len(t.values) for t in wire.top_logprobs] == [3] * len(whole.tokens)
    per_chunk = [t for c in streamed.chunks for t in c.output_logprobs.token_ids]
    assert per_chunk == whole.tokens


async def test_two_samples_stream_with_their_indices(workers) -> None:
    p = prompt(model_dir("qwen"), "Say something.")
    req = sglang_request("n2", p, 6, stream=True, temperature=1.0, n=2, ignore_eos=True)
    out = await generate(workers["qwen-sgl"].address, req)
    assert {c.index for c in out.chunks} == {0, 1}
    assert sorted(c.index for c in out.completes) == [0, 1]
    for index in (0, 1):
        assert len(out.streamed(index)) == 6
        done = next(c for c in out.completes if c.index == index)
        assert done.completion_tokens == 6 and done.finish_reason == "length"


async def test_abort_ends_the_stream_and_frees_the_engine(workers) -> None:
    address = workers["qwen-sgl"].address
    p = prompt(model_dir("qwen"), "Talk for a long time.")
    req = sglang_request("abort-me", p, 3000, stream=True, ignore_eos=True)
    async with grpc.aio.insecure_channel(address) as channel:
        stub = spb_grpc.SglangSchedulerStub(channel)
        call_ = stub.Generate(req, timeout=60)
        first = await call_.read()
        assert first.HasField("chunk")
        reply = await stub.Abort(spb.AbortRequest(request_id="abort-me", reason="test"))
        assert reply.success
        last = None
        while (frame := await call_.read()) is not grpc.aio.EOF:
            last = frame
    assert last is not None and last.complete.finish_reason == "abort"
    assert last.complete.completion_tokens < 3000
    after = await stats(address)
    assert after["running"] == 0 and after["requests_by_outcome"].get("abort", 0) >= 1


async def test_info_calls_describe_the_worker(workers) -> None:
    prefill = workers["qwen-prefill"].address
    async with grpc.aio.insecure_channel(prefill) as channel:
        stub = spb_grpc.SglangSchedulerStub(channel)
        server_call = stub.GetServerInfo(spb.GetServerInfoRequest(), timeout=10)
        server = await server_call
        assert dict(await server_call.trailing_metadata()).get("tandem-worker")
        args = dict(server.server_args.items())
        assert args["disaggregation_mode"] == "prefill"
        assert int(args["disaggregation_bootstrap_port"]) == BOOTSTRAP_PORT
        assert args["served_model_name"] == MODELS["qwen"] and int(args["tp_size"]) == 1
        assert server.server_type == "grpc" and server.sglang_version.startswith("tandem-")
        loads = await stub.GetLoads(spb.GetLoadsRequest(include=["core"]), timeout=10)
        assert loads.dp_rank_count == 1 and loads.loads[0].dp_rank == 0
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
    both = await call(workers["qwen-sgl"].address, "GetServerInfo", spb.GetServerInfoRequest())
    assert dict(both.server_args.items())["disaggregation_mode"] == "null"
    lmo = await call(workers["llava-lmo"].address, "GetModelInfo", spb.GetModelInfoRequest())
    assert lmo.supports_vision is False and lmo.served_model_name == MODELS["llava"]
    assert "Traceback" not in workers["qwen-prefill"].output()
