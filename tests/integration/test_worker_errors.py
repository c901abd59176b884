"""Bad input gets INVALID_ARGUMENT with a readable message, and the worker keeps serving."""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
import pytest

from tandem.wire.proto import GenerateRequest, TensorData, pb
from tandem.wire.tensors import encode_tensor

from .processes import start_all
from .wire_helpers import call, chat_prompt_ids, generate, healthy, image_data_url, request


@pytest.fixture(scope="module")
def workers(model_cache: Path):
    procs = start_all(
        [
            ["worker", "--model", "tiny-qwen3-vl", "--mm-processor", "off"],
            ["worker", "--model", "tiny-llava-1.5", "--language-model-only"],
        ]
    )
    yield {"qwen": procs[0], "lmo": procs[1]}
    for proc in procs:
        proc.stop()


def text_request(qwen_dir: Path, rid: str) -> GenerateRequest:
    return request(rid, chat_prompt_ids(qwen_dir, "hello", 0), max_tokens=2)


def cases(qwen_dir: Path) -> dict[str, tuple[GenerateRequest, str]]:
    bad_json = text_request(qwen_dir, "bad-json")
    bad_json.kv_transfer_params_json = "{not json"
    not_object = text_request(qwen_dir, "not-object")
    not_object.kv_transfer_params_json = "[1, 2]"
    short = text_request(qwen_dir, "short-bytes")
    short.mm_inputs.pixel_values.CopyFrom(TensorData(shape=[2, 4], dtype="float32", inline=b"x"))
    short.mm_inputs.mm_hashes.append("h")
    dtype = text_request(qwen_dir, "bad-dtype")
    dtype.mm_inputs.pixel_values.CopyFrom(
        TensorData(shape=[1], dtype="complex64", inline=b"\0" * 8)
    )
    grids = text_request(qwen_dir, "grids-no-kv")
    grids.mm_inputs.model_specific_tensors["image_grid_thw"].CopyFrom(
        encode_tensor(np.array([[1, 4, 4]], dtype=np.int64))
    )
    grids.mm_inputs.mm_hashes.append("h")
    grids.mm_inputs.mm_placeholders.add(offset=1, length=4)
    refs_off = request("refs-off", chat_prompt_ids(qwen_dir, "hi", 1), [image_data_url(1)])
    text_input = GenerateRequest(request_id="text-input", text="hello")
    return {
        "malformed KV params JSON": (bad_json, "not valid JSON"),
        "KV params not an object": (not_object, "JSON object"),
        "tensor byte-length mismatch": (short, "byte length mismatch"),
        "unknown dtype": (dtype, "Unsupported proto tensor dtype"),
        "grids without pixels and without KV": (grids, "pixel-less leg requires remote KV"),
        "media refs while the processor is off": (refs_off, "media processor is off"),
        "text input": (text_input, "tokenized input"),
    }


async def test_bad_input_is_invalid_argument_and_worker_survives(workers, qwen_dir) -> None:
    address = workers["qwen"].address
    for name, (req, needle) in cases(qwen_dir).items():
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await generate(address, req)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, name
        assert needle in (info.value.details() or ""), (name, info.value.details())
    assert await healthy(address)
    assert (await generate(address, text_request(qwen_dir, "after"))).tokens


async def test_language_model_only_worker_is_honest_and_refuses_media(workers, llava_dir) -> None:
    address = workers["lmo"].address
    model = await call(address, "GetModelInfo", pb.GetModelInfoRequest())
    server = await call(address, "GetServerInfo", pb.GetServerInfoRequest())
    assert model.supports_vision is False
    assert server.mm_processor == "" and server.mm_media_ref_schemes == ""
    refs = request("lmo-refs", chat_prompt_ids(llava_dir, "hi", 1), [image_data_url(3)])
    pixels = request("lmo-pixels", chat_prompt_ids(llava_dir, "hi", 0))
    pixels.mm_inputs.pixel_values.CopyFrom(encode_tensor(np.zeros((1, 3, 8, 8), np.float32)))
    pixels.mm_inputs.mm_hashes.append("h")
    for req in (refs, pixels):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await generate(address, req)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "language model only" in (info.value.details() or "")
    assert await healthy(address)


async def test_vision_worker_advertises_processor(workers, qwen_dir) -> None:
    server = await call(workers["qwen"].address, "GetServerInfo", pb.GetServerInfoRequest())
    model = await call(workers["qwen"].address, "GetModelInfo", pb.GetModelInfoRequest())
    assert model.supports_vision is True and model.model_type == "qwen3_vl"
    assert server.server_type == "vllm-grpc" and server.kv_connector
    assert server.mm_processor == ""  # this one runs with --mm-processor off
