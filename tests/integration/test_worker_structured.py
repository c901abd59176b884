"""Structured outputs and logprobs over gRPC, against real `tandem worker` processes.

One embedded worker (tiny-qwen3-vl, in-process media) and one null-engine worker on
127.0.0.1. Bad constraints are INVALID_ARGUMENT with the catalogued code in the trailing
metadata, a refused decode leg frees the prefill's KV at once, and logprobs travel where
vLLM's servicer puts them: in each streamed chunk, or all in a non-streamed Complete.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import jsonschema_rs
import pytest

from tandem.errors import WORKER_ERROR_CODE_KEY
from tandem.wire.proto import GenerateRequest, pb, pb_grpc

from .processes import start_all
from .wire_helpers import (
    PREFILL_TAG,
    chat_prompt_ids,
    generate,
    healthy,
    image_data_url,
    request,
    stats,
)

SCHEMA = {
    "type": "object",
    "properties": {
        "color": {"enum": ["red", "blue"]},
        "n": {"type": "integer", "minimum": 1, "maximum": 5},
    },
    "required": ["color", "n"],
    "additionalProperties": False,
}
PROMPT = "Reply with a JSON object naming the colour."


@pytest.fixture(scope="module")
def workers(model_cache: Path):
    procs = start_all(
        [
            ["worker", "--model", "tiny-qwen3-vl"],
            ["worker", "--model", "tiny-qwen3-vl", "--engine", "null", "--mm-processor", "off"],
        ]
    )
    yield {"qwen": procs[0], "null": procs[1]}
    for proc in procs:
        proc.stop()


@dataclass
class Frames:
    chunks: list[pb.GenerateStreamChunk] = field(default_factory=list)
    completes: list[pb.GenerateComplete] = field(default_factory=list)


async def frames(address: str, req: GenerateRequest) -> Frames:
    async with grpc.aio.insecure_channel(address) as channel:
        got = Frames()
        async for response in pb_grpc.VllmEngineStub(channel).Generate(req, timeout=60):
            if response.HasField("chunk"):
                got.chunks.append(response.chunk)
            else:
                got.completes.append(response.complete)
        return got


async def refused(address: str, req: GenerateRequest) -> tuple[grpc.StatusCode, str, str]:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await frames(address, req)
    err = info.value
    code = dict(err.trailing_metadata() or ()).get(WORKER_ERROR_CODE_KEY, "")
    return err.code(), err.details() or "", code


def text_request(qwen_dir: Path, rid: str, **sampling) -> GenerateRequest:
    return request(rid, chat_prompt_ids(qwen_dir, PROMPT, 0), **sampling)


BAD = {
    "schema": ({"json_schema": '{"type": 5}'}, "Type should be a string"),
    "schema JSON": ({"json_schema": "{nope"}, "not valid JSON"),
    "regex": ({"regex": "(a"}, "The parenthesis is not closed"),
    "grammar": ({"grammar": "root ::= foo"}, 'Rule "foo" is not defined'),
    "json_object false": ({"json_object": False}, "json_object must be true"),
    "no choices": ({"choice": pb.ChoiceConstraint()}, "at least one"),
}


async def test_bad_constraints_are_invalid_argument_and_the_worker_serves_on(
    workers, qwen_dir: Path
) -> None:
    address = workers["qwen"].address
    for name, (fields, needle) in BAD.items():
        req = text_request(qwen_dir, f"bad-{name}")
        for key, value in fields.items():
            if key == "choice":
                req.sampling_params.choice.CopyFrom(value)
            else:
                setattr(req.sampling_params, key, value)
        status, details, code = await refused(address, req)
        assert status == grpc.StatusCode.INVALID_ARGUMENT, name
        assert (code, needle in details) == ("invalid_structured_output", True), (name, details)
        assert ".cc:" not in details, details
    status, details, code = await refused(address, text_request(qwen_dir, "pl", prompt_logprobs=0))
    assert (status, code) == (grpc.StatusCode.INVALID_ARGUMENT, "unsupported_parameter")
    status, details, _ = await refused(address, text_request(qwen_dir, "all", logprobs=-1))
    assert status == grpc.StatusCode.INVALID_ARGUMENT and "0..20" in details
    assert await healthy(address)
    ok = text_request(qwen_dir, "after", max_tokens=8)
    ok.sampling_params.choice.choices.extend(["yes", "no"])
    out = await generate(address, ok)
    assert bytes(out.tokens[:-1]).decode() in ("yes", "no")
    assert out.complete.finish_reason == "stop"


async def test_a_refused_decode_leg_frees_the_prefill_kv_at_once(workers, qwen_dir: Path) -> None:
    address = workers["qwen"].address
    before = (await stats(address))["kv_released"]
    leg = text_request(qwen_dir, "pd-bad", max_tokens=1)
    leg.kv_transfer_params_json = PREFILL_TAG
    prefill = await generate(address, leg)
    assert (await stats(address))["held_transfers"] == 1
    decode = text_request(qwen_dir, "pd-bad", json_schema='{"type": 5}')
    decode.kv_transfer_params_json = prefill.complete.kv_transfer_params_json
    status, _, code = await refused(address, decode)
    assert (status, code) == (grpc.StatusCode.INVALID_ARGUMENT, "invalid_structured_output")
    after = await stats(address)
    assert after["held_transfers"] == 0  # released now, not at the lease's end
    assert after["kv_released"] == before + 1


def entries(message: pb.OutputLogProbs) -> list[tuple[int, float, list[int], list[float]]]:
    tops = list(message.top_logprobs) or [pb.TopLogProbs()] * len(message.token_ids)
    return [
        (tid, value, list(top.token_ids), list(top.values))
        for tid, value, top in zip(message.token_ids, message.token_logprobs, tops, strict=True)
    ]


@pytest.mark.parametrize("top", [0, 3])
async def test_logprobs_go_in_the_chunks_when_streamed_and_in_the_complete_when_not(
    workers, qwen_dir: Path, top: int
) -> None:
    address = workers["qwen"].address
    base = text_request(qwen_dir, f"lp-{top}", max_tokens=200, logprobs=top)
    base.sampling_params.json_schema = json.dumps(SCHEMA)

    whole = await frames(address, base)
    (complete,) = whole.completes
    assert not whole.chunks
    assert complete.finish_reason == "stop"
    answer = json.loads(bytes(complete.output_ids[:-1]).decode())
    assert jsonschema_rs.validator_for(SCHEMA).is_valid(answer)
    full = entries(complete.output_logprobs)
    assert [tid for tid, *_ in full] == list(complete.output_ids)
    for tid, value, top_ids, top_values in full:
        assert value <= 0.0
        assert len(top_ids) == len(top_values) == top
        assert top_values == sorted(top_values, reverse=True)
        if top:
            assert (top_ids[0], top_values[0]) == (tid, pytest.approx(value))  # greedy
    if not top:
        assert not complete.output_logprobs.top_logprobs

    streamed_req = GenerateRequest.FromString(base.SerializeToString())
    streamed_req.stream = True
    streamed = await frames(address, streamed_req)
    pieces = []
    for chunk in streamed.chunks:
        assert [tid for tid, *_ in entries(chunk.output_logprobs)] == list(chunk.token_ids)
        pieces.extend(entries(chunk.output_logprobs))
    assert pieces == full
    assert not streamed.completes[0].HasField("output_logprobs")

    plain = await frames(address, text_request(qwen_dir, "no-lp", max_tokens=3))
    assert not plain.completes[0].HasField("output_logprobs")


async def test_a_constrained_image_request_over_media_refs(workers, qwen_dir: Path) -> None:
    req = request(
        "img-schema",
        chat_prompt_ids(qwen_dir, PROMPT, 1),
        [image_data_url(3)],
        max_tokens=200,
        temperature=1.0,
        seed=4,
        n=2,
        json_schema=json.dumps(SCHEMA),
    )
    out = await generate(workers["qwen"].address, req)
    assert len(out.completes) == 2
    validator = jsonschema_rs.validator_for(SCHEMA)
    for complete in out.completes:
        assert complete.finish_reason == "stop"
        assert validator.is_valid(json.loads(bytes(complete.output_ids[:-1]).decode()))


async def test_the_null_engine_refuses_constraints_and_logprobs(workers, qwen_dir: Path) -> None:
    address = workers["null"].address
    for rid, sampling in (("null-regex", {"regex": "a+"}), ("null-lp", {"logprobs": 1})):
        status, details, code = await refused(address, text_request(qwen_dir, rid, **sampling))
        assert (status, code) == (grpc.StatusCode.INVALID_ARGUMENT, "unsupported_parameter")
        assert "null engine" in details
    assert (await generate(address, text_request(qwen_dir, "null-ok", max_tokens=2))).tokens
