"""The TensorRT-LLM servicer over the embedded engine and the trained built-in models.

A real worker server in this process (the process's own ``WorkerServer``), real forward
passes: the pictures come as their PNG bytes and the worker's own decoding and
preprocessing must make the model name them; each image's digest and ``cache_salt_id``
salt the prefix cache; logprobs, n = 2, the stop token, the constraint kinds, the bias
and the perf metrics are those of a real engine.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from io import BytesIO
from pathlib import Path

import grpc
import pytest
from PIL import Image
from tokenizers import Tokenizer

from tandem.engine.builtin_shapes import draw
from tandem.models.chat import render_chat
from tandem.models.info import load_model_info
from tandem.models.processor import load_processor
from tandem.wire.trtllm import trpb, trpb_grpc
from tandem.worker.config import WorkerConfig
from tandem.worker.server import WorkerServer

pytestmark = pytest.mark.timeout(120)
GUIDE = trpb.GuidedDecodingParams


@pytest.fixture
async def worker(qwen_dir: Path) -> AsyncIterator[trpb_grpc.TrtllmServiceStub]:
    server = WorkerServer(WorkerConfig(model=str(qwen_dir), protocol="trtllm"))
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        yield trpb_grpc.TrtllmServiceStub(channel)
    await server.stop(0)


def prompt(model_dir: Path, text: str, pictures: Sequence[bytes] = ()) -> list[int]:
    """The chat prompt's ids with each picture's run expanded, as gateways send them."""
    parts: list[dict] = [{"type": "image_url", "image_url": {"url": "x"}}] * len(pictures)
    rendered = render_chat(
        model_dir, [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]
    )
    ids = (
        Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        .encode(rendered, add_special_tokens=False)
        .ids
    )
    if not pictures:
        return ids
    info = load_model_info(model_dir)
    images = [Image.open(BytesIO(blob)).convert("RGB") for blob in pictures]
    counts = iter(load_processor(model_dir).preprocess(images).tokens_per_image)
    out: list[int] = []
    for tid in ids:
        out += [info.image_token_id] * next(counts) if tid == info.anchor_token_id else [tid]
    return out


def request(
    rid: str, ids: list[int], max_tokens: int = 24, *, streaming: bool = False
) -> trpb.GenerateRequest:
    req = trpb.GenerateRequest(request_id=rid, streaming=streaming, max_tokens=max_tokens)
    req.tokenized.input_token_ids.extend(ids)
    req.sampling_config.beam_width = 1
    req.sampling_config.temperature = 0.0
    req.output_config.exclude_input_from_output = True
    return req


Answer = tuple[list[trpb.GenerateStreamChunk], dict[int, trpb.GenerateComplete]]


async def run(stub: trpb_grpc.TrtllmServiceStub, req: trpb.GenerateRequest) -> Answer:
    chunks, completes = [], {}
    async for frame in stub.Generate(req, timeout=60):
        if frame.HasField("chunk"):
            chunks.append(frame.chunk)
        else:
            completes[frame.complete.sequence_index] = frame.complete
    return chunks, completes


def text(model_dir: Path, ids: list[int]) -> str:
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    return tokenizer.decode(list(ids), skip_special_tokens=True).strip()


def streamed(chunks: list[trpb.GenerateStreamChunk], index: int = 0) -> list[int]:
    return [t for c in chunks if c.sequence_index == index for t in c.token_ids]


async def test_pictures_sent_as_bytes_are_named_and_their_digest_salts_the_cache(
    worker, qwen_dir: Path
) -> None:
    """Red, blue, then red again (same size, same token count): had the images been keyed
    by anything but their own bytes, the blue one would reuse the red one's KV."""
    info = load_model_info(qwen_dir)
    answers = []
    for k, colour in enumerate(("red", "blue", "red")):
        blob = draw(colour, "circle", (128, 128)).png()
        ids = prompt(qwen_dir, "What is in this picture?", [blob])
        req = request(f"colour-{k}", ids)
        req.multimodal_input.image_data.append(blob)
        _, completes = await run(worker, req)
        done = completes[0]
        assert text(qwen_dir, list(done.output_token_ids)) == f"a {colour} circle"
        first_image = ids.index(info.image_token_id)
        answers.append((done.cached_tokens, first_image))
    (_, image_at), (blue_cached, _), (red_cached, _) = answers
    assert blue_cached <= image_at, "another picture shares no KV past its first image token"
    assert red_cached > image_at, "the same picture's KV is reused"


async def test_the_cache_salt_keeps_prefixes_apart(worker, qwen_dir: Path) -> None:
    ids = prompt(qwen_dir, "Say something about circles, squares and triangles. " * 3)
    cached = []
    for rid, salt in (("s1", 7), ("s2", 7), ("s3", 8), ("s4", None)):
        req = request(rid, ids, max_tokens=2)
        if salt is not None:
            req.cache_salt_id = salt
        cached.append((await run(worker, req))[1][0].cached_tokens)
    assert cached[1] > 0, "the same salt reuses the prefix"
    assert cached[2] == 0 and cached[3] == 0, "another salt, or none, does not"


async def test_streamed_and_whole_answers_agree_and_the_stop_token_is_stripped(
    worker, qwen_dir: Path
) -> None:
    blob = draw("green", "square", (96, 96)).png()
    ids = prompt(qwen_dir, "What is in the picture?", [blob])
    whole_req = request("whole", ids)
    whole_req.multimodal_input.image_data.append(blob)
    _, whole = await run(worker, whole_req)
    stream_req = request("stream", ids, streaming=True)
    stream_req.multimodal_input.image_data.append(blob)
    chunks, done = await run(worker, stream_req)
    kept_req = request("kept", ids)
    kept_req.multimodal_input.image_data.append(blob)
    kept_req.include_stop_token_in_output = True
    _, kept = await run(worker, kept_req)
    eos = whole[0].matched_token_id
    assert whole[0].finish_reason == "stop" and eos in load_model_info(qwen_dir).eos_token_ids
    assert streamed(chunks) == list(done[0].output_token_ids) == list(whole[0].output_token_ids)
    assert list(kept[0].output_token_ids) == [*whole[0].output_token_ids, eos]
    assert whole[0].completion_tokens == len(whole[0].output_token_ids) + 1
    assert text(qwen_dir, list(whole[0].output_token_ids)) == "a green square"


async def test_two_seeded_samples_with_logprobs_in_both_modes(worker, qwen_dir: Path) -> None:
    ids = prompt(qwen_dir, "Say something.")
    answers = []
    for streaming in (True, False):
        req = request(f"lp-{streaming}", ids, max_tokens=6, streaming=streaming)
        req.sampling_config.temperature, req.sampling_config.seed = 4.0, 11
        req.sampling_config.num_return_sequences = 2
        req.ignore_eos = True
        req.output_config.logprobs = 3
        answers.append(await run(worker, req))
    (chunks, streamed_done), (_, whole) = answers
    assert sorted(whole) == [0, 1] and sorted(streamed_done) == [0, 1]
    for index in (0, 1):
        tokens = list(whole[index].output_token_ids)
        assert len(tokens) == 6 and streamed(chunks, index) == tokens, "seeded: both modes agree"
        entries = whole[index].logprobs
        assert [e.token_id for e in entries] == tokens
        assert all(len(e.top_logprobs) == 3 for e in entries)
        assert all(e.top_logprobs[0].logprob >= e.top_logprobs[-1].logprob for e in entries)
        per_chunk = [e for c in chunks if c.sequence_index == index for e in c.logprobs]
        assert [e.token_id for e in per_chunk] == tokens
        assert [e.logprob for e in per_chunk] == pytest.approx([e.logprob for e in entries])
        assert not streamed_done[index].logprobs, "streamed, they went in the chunks"
    assert list(whole[0].output_token_ids) != list(whole[1].output_token_ids), "two samples"


@pytest.mark.parametrize(
    ("guide_type", "guide", "allowed"),
    [
        (GUIDE.GUIDE_TYPE_REGEX, "(yes|no)", {"yes", "no"}),
        (GUIDE.GUIDE_TYPE_JSON_SCHEMA, json.dumps({"enum": ["red", "blue"]}), {'"red"', '"blue"'}),
        (GUIDE.GUIDE_TYPE_EBNF_GRAMMAR, 'root ::= "circle" | "square"', {"circle", "square"}),
    ],
)
async def test_guided_decoding_constrains_the_answer(
    worker, qwen_dir, guide_type, guide, allowed
) -> None:
    req = request("guided", prompt(qwen_dir, "Pick one."), max_tokens=20)
    req.guided_decoding.guide_type = guide_type
    req.guided_decoding.guide = guide
    done = (await run(worker, req))[1][0]
    assert done.finish_reason == "stop"
    assert text(qwen_dir, list(done.output_token_ids)) in allowed


async def test_the_embedding_bias_steers_and_perf_metrics_come_back(worker, qwen_dir) -> None:
    ids = prompt(qwen_dir, "Say something.")
    plain = (await run(worker, request("plain", ids, max_tokens=3)))[1][0]
    favoured = (int(plain.output_token_ids[0]) + 1) % 200 + 10
    req = request("biased", ids, max_tokens=3)
    bias = [0.0] * load_model_info(qwen_dir).vocab_size
    bias[favoured] = 100.0
    req.embedding_bias.extend(bias)
    req.output_config.return_perf_metrics = True
    done = (await run(worker, req))[1][0]
    assert list(done.output_token_ids) == [favoured] * 3
    metrics = done.perf_metrics
    assert 0 < metrics.arrival_time <= metrics.first_scheduled_time
    assert metrics.first_scheduled_time <= metrics.first_token_time <= metrics.last_token_time
    assert metrics.kv_cache_size > 0
    info = await worker.GetModelInfo(trpb.GetModelInfoRequest())
    assert {"logprobs", "guided_decoding", "vision"} <= set(info.supported_features)
