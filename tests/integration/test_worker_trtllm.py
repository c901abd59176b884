"""`tandem worker --protocol trtllm`: real worker processes, real forward passes.

Every worker here is a real `tandem worker` process on 127.0.0.1, driven over raw gRPC
with what a TensorRT-LLM gateway sends: the prompt's ids with each image's run expanded,
the images as their PNG bytes (the worker decodes and preprocesses them itself), beam
width 1, the prompt excluded from the output. Greedy answers are compared with the same
model's over `--protocol vllm`, given the same ids and the router path's pixels of the
same pictures: the same ids in must give the same ids out, streamed and not.
"""

from __future__ import annotations

import base64
from pathlib import Path

import grpc
import pytest

from tandem.engine.builtin_shapes import draw
from tandem.errors import WORKER_ERROR_CODE_KEY
from tandem.wire.trtllm import trpb, trpb_grpc

from .processes import start_all
from .wire_helpers import generate as vllm_generate
from .wire_helpers import image_data_url, stats
from .worker_sglang_helpers import prompt, text_of, vllm_request

MODELS = {"qwen": "tiny-qwen3-vl", "llava": "tiny-llava-1.5"}
TRT = ["--protocol", "trtllm"]
WORKERS = {
    "qwen-trt": ["--model", MODELS["qwen"], *TRT],
    "qwen-vllm": ["--model", MODELS["qwen"], "--protocol", "vllm"],
    "llava-trt": ["--model", MODELS["llava"], *TRT],
    "llava-vllm": ["--model", MODELS["llava"], "--protocol", "vllm"],
    "llava-lmo": ["--model", MODELS["llava"], *TRT, "--language-model-only"],
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


def pngs(n: int, seed: int = 0) -> list[bytes]:
    """``n`` distinct PNG pictures (seeded noise, as the other worker tests use)."""
    return [base64.b64decode(image_data_url(seed + k).split(",", 1)[1]) for k in range(n)]


def pictures(blobs: list[bytes]) -> list:
    import io

    from PIL import Image

    return [Image.open(io.BytesIO(blob)).convert("RGB") for blob in blobs]


def trt_request(
    rid: str, ids: list[int], blobs: list[bytes], max_tokens: int = 8, *, streaming: bool = False
) -> trpb.GenerateRequest:
    """As smg 1.13 writes a chat request (no seed, no stop ids), greedy."""
    req = trpb.GenerateRequest(request_id=rid, max_tokens=max_tokens, streaming=streaming)
    req.tokenized.original_text = "(not read)"
    req.tokenized.input_token_ids.extend(ids)
    sampling = req.sampling_config
    sampling.beam_width, sampling.num_return_sequences = 1, 1
    sampling.temperature, sampling.top_p, sampling.repetition_penalty = 0.0, 1.0, 1.0
    sampling.presence_penalty = sampling.frequency_penalty = 0.0
    req.output_config.exclude_input_from_output = True
    if blobs:
        req.multimodal_input.image_data.extend(blobs)
    return req


class TrtOutcome:
    def __init__(self) -> None:
        self.chunks: list[trpb.GenerateStreamChunk] = []
        self.completes: dict[int, trpb.GenerateComplete] = {}
        self.request_ids: set[str] = set()

    def streamed(self, index: int = 0) -> list[int]:
        return [t for c in self.chunks if c.sequence_index == index for t in c.token_ids]

    @property
    def tokens(self) -> list[int]:
        return list(self.completes[0].output_token_ids)


async def generate(address: str, req: trpb.GenerateRequest) -> TrtOutcome:
    outcome = TrtOutcome()
    async with grpc.aio.insecure_channel(address) as channel:
        async for frame in trpb_grpc.TrtllmServiceStub(channel).Generate(req, timeout=60):
            outcome.request_ids.add(frame.request_id)
            if frame.HasField("chunk"):
                outcome.chunks.append(frame.chunk)
            else:
                outcome.completes[frame.complete.sequence_index] = frame.complete
    return outcome


async def call(address: str, method: str, message: object) -> object:
    async with grpc.aio.insecure_channel(address) as channel:
        return await getattr(trpb_grpc.TrtllmServiceStub(channel), method)(message, timeout=10)


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("family", ["qwen", "llava"])
@pytest.mark.parametrize("n_images", [0, 1, 2])
async def test_the_trtllm_adapter_answers_as_the_vllm_adapter(
    workers, family: str, n_images: int, streaming: bool
) -> None:
    blobs = pngs(n_images, seed=10 * n_images)
    p = prompt(model_dir(family), "What is in the picture?", pictures(blobs))
    reference = await vllm_generate(workers[f"{family}-vllm"].address, vllm_request("eq", p, 40))
    req = trt_request("eq", p.ids, blobs, 40, streaming=streaming)
    req.include_stop_token_in_output = True  # vLLM's ids keep the stop token
    trt = await generate(workers[f"{family}-trt"].address, req)
    assert len(trt.tokens) >= 1 and trt.request_ids == {"eq"}
    assert trt.tokens == reference.tokens
    if streaming:
        assert trt.streamed() == trt.tokens
    done, ref = trt.completes[0], reference.complete
    assert (done.prompt_tokens, done.completion_tokens) == (len(p.ids), ref.completion_tokens)
    assert done.finish_reason == ref.finish_reason == "stop", "40 tokens: the answer ends"
    assert done.matched_token_id == reference.tokens[-1]
    cut = trt_request("cut", p.ids, blobs, 40, streaming=streaming)
    stripped = await generate(workers[f"{family}-trt"].address, cut)
    assert stripped.tokens == reference.tokens[:-1], "the stop token is left out by default"
    assert stripped.completes[0].matched_token_id == reference.tokens[-1]


@pytest.mark.parametrize("family", ["qwen", "llava"])
async def test_red_and_blue_pictures_sent_as_bytes_are_told_apart(workers, family) -> None:
    """The same text behind a red, a blue, then the red picture (same size and token
    count): only the worker's own digest of the bytes tells their KV apart."""
    address = workers[f"{family}-trt"].address
    for k, colour in enumerate(("red", "blue", "red")):
        blob = draw(colour, "circle", (128, 128)).png()
        p = prompt(model_dir(family), "What is in this picture?", pictures([blob]))
        out = await generate(address, trt_request(f"colour-{k}", p.ids, [blob], 20))
        assert text_of(model_dir(family), out.tokens) == f"a {colour} circle"
        assert out.completes[0].finish_reason == "stop"


async def test_an_smg_shaped_request_without_max_tokens_ends_at_eos(workers) -> None:
    """smg sends 2048 when the client gave no limit: it fits the context and the answer
    ends on EOS, stripped and named."""
    p = prompt(model_dir("qwen"), "Say something.")
    out = await generate(
        workers["qwen-trt"].address, trt_request("smg", p.ids, [], 2048, streaming=True)
    )
    done = out.completes[0]
    assert done.finish_reason == "stop" and done.completion_tokens == len(out.tokens) + 1
    assert done.WhichOneof("matched_stop") == "matched_token_id"
    assert out.streamed() == out.tokens


def _refused(case: str) -> tuple[trpb.GenerateRequest, str, str]:
    blobs = pngs(1, seed=70)
    p = prompt(model_dir("qwen"), "Refuse me.", pictures(blobs))
    req = trt_request(f"refuse-{case}", p.ids, blobs)
    if case == "stop":  # smg forwards a client's stop strings
        req.stop.append("\n")
        return req, "stop: this worker does not detokenize", "unsupported_parameter"
    if case == "pd":
        req.disaggregated_params.request_type = trpb.DisaggregatedParams.REQUEST_TYPE_CONTEXT_ONLY
        return req, "disaggregated_params.request_type", "runtime_pd_not_supported"
    if case == "unexpanded":
        del req.tokenized.input_token_ids[:]
        req.tokenized.input_token_ids.extend([*prompt(model_dir("qwen"), "Refuse me.").ids, 261])
        return req, "image_data[0] expands to", "multimodal_prompt_contract_mismatch"
    if case == "two_images_one_run":
        req.multimodal_input.image_data.append(blobs[0])
        return (
            req,
            "has 2 image(s) but the prompt's image tokens hold only 1",
            ("multimodal_prompt_contract_mismatch"),
        )
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["stop", "pd", "unexpanded", "two_images_one_run"])
async def test_refusals_are_invalid_argument(workers, case: str) -> None:
    req, words, code = _refused(case)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await generate(workers["qwen-trt"].address, req)
    err = info.value
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
    assert words in (err.details() or "")
    assert dict(err.trailing_metadata() or ()).get(WORKER_ERROR_CODE_KEY, "") == code


async def test_a_language_model_only_worker_answers_text_and_refuses_images(workers) -> None:
    address = workers["llava-lmo"].address
    text = prompt(model_dir("llava"), "Say something.")
    reference = await generate(workers["llava-trt"].address, trt_request("t", text.ids, []))
    assert (await generate(address, trt_request("t", text.ids, []))).tokens == reference.tokens
    blobs = pngs(1, seed=90)
    p = prompt(model_dir("llava"), "Describe it.", pictures(blobs))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await generate(address, trt_request("img", p.ids, blobs))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "runs the language model only" in (info.value.details() or "")
    model = await call(address, "GetModelInfo", trpb.GetModelInfoRequest())
    assert "vision" not in model.supported_features and model.model_id == MODELS["llava"]


async def test_info_calls_health_and_stats_describe_the_worker(workers) -> None:
    address = workers["qwen-trt"].address
    async with grpc.aio.insecure_channel(address) as channel:
        stub = trpb_grpc.TrtllmServiceStub(channel)
        server_call = stub.GetServerInfo(trpb.GetServerInfoRequest(), timeout=10)
        server = await server_call
        assert dict(await server_call.trailing_metadata()).get("tandem-worker")
        assert server.backend == "pytorch" and server.world_size == 1
        assert (await stub.HealthCheck(trpb.HealthCheckRequest(), timeout=10)).status == "OK"
        model = await stub.GetModelInfo(trpb.GetModelInfoRequest(), timeout=10)
        assert model.model_id == MODELS["qwen"] and model.max_seq_len == 4096
        assert {"vision", "logprobs", "guided_decoding"} <= set(model.supported_features)
    counts = await stats(address)
    assert counts["media_items_processed"] > 0
    legs = counts["leg_bytes"]["aggregated"]
    assert legs["requests"] > 0 and legs["image_bytes"] > 0 and legs["pixel_bytes"] == 0
    for name in WORKERS:
        assert "Traceback" not in workers[name].output()
