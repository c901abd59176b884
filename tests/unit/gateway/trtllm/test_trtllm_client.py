"""The TensorRT-LLM client's calls against a real loopback stand-in worker: health read
from the status string, the info calls read into labels (the Tandem marker, the
``supports_vision`` rule agreed with Tandem's worker), the tokenizer, one ``Abort`` per id,
and no load call ever sent (the service has none)."""

from __future__ import annotations

import json

import pytest
from trtllm_standin import TOKENIZER_ZIP, StandinServer, StandinState

from tandem import __version__
from tandem.gateway.backends.trtllm.client import TrtllmClient
from tandem.gateway.backends.trtllm.labels import model_id_of, worker_labels
from tandem.gateway.backends.trtllm.sender import TrtllmSender
from tandem.gateway.workers.registry import WorkerRegistry
from tandem.wire.trtllm import trpb
from tandem.wire.worker_marker import TANDEM_WORKER_LABEL


@pytest.mark.parametrize(
    ("status", "healthy"),
    [("OK", True), ("ok ", True), (" Ok\n", True), ("degraded", False), ("", False)],
)
async def test_health_is_the_status_string(status: str, healthy: bool) -> None:
    state = StandinState(status=status)
    async with StandinServer(state) as server:
        client = TrtllmClient(server.url)
        try:
            assert await client.health_check(5.0) is healthy
            assert await client.speaks_protocol(5.0)  # any answer names the protocol
        finally:
            await client.close()


async def test_a_worker_that_is_gone_is_unhealthy() -> None:
    async with StandinServer(StandinState()) as server:
        url = server.url
    client = TrtllmClient(url)
    try:
        assert not await client.health_check(0.5)
    finally:
        await client.close()


def model_info(**fields: object) -> trpb.GetModelInfoResponse:
    base: dict[str, object] = {
        "model_id": "tiny-qwen3-vl",
        "max_input_len": 4000,
        "max_seq_len": 4096,
        "vocab_size": 512,
        "supported_features": ["guided_decoding", "vision"],
    }
    return trpb.GetModelInfoResponse(**{**base, **fields})  # type: ignore[arg-type]


SERVER = trpb.GetServerInfoResponse(
    version="1.2",
    backend="pytorch",
    tensor_parallel_size=2,
    pipeline_parallel_size=1,
    context_parallel_size=1,
    world_size=2,
)


def test_labels_from_both_info_calls() -> None:
    labels = worker_labels(model_info(), SERVER, "0.9")
    assert labels["tp_size"] == "2" and labels["pp_size"] == "1" and labels["cp_size"] == "1"
    assert "tensor_parallel_size" not in labels and labels["world_size"] == "2"
    assert labels["version"] == "1.2" and labels["backend"] == "pytorch"
    assert labels["max_seq_len"] == labels["context_length"] == "4096"
    assert labels["vocab_size"] == "512" and labels["max_input_len"] == "4000"
    assert json.loads(labels["supported_features"]) == ["guided_decoding", "vision"]
    assert labels["protocol"] == "trtllm" and labels[TANDEM_WORKER_LABEL] == "0.9"
    assert labels["supports_vision"] == "true"
    assert model_id_of(model_info()) == "tiny-qwen3-vl"
    assert model_id_of(model_info(model_id="  ")) == ""


@pytest.mark.parametrize(
    ("features", "marker", "vision"),
    [
        (["vision"], "0.9", "true"),  # a Tandem worker running a vision tower
        (["guided_decoding"], "0.9", "false"),  # a Tandem worker without one
        (["guided_decoding"], "", "true"),  # TensorRT-LLM's own: its engine takes images
        ([], "", "true"),
    ],
)
def test_supports_vision(features: list[str], marker: str, vision: str) -> None:
    labels = worker_labels(model_info(supported_features=features), SERVER, marker)
    assert labels["supports_vision"] == vision
    assert (TANDEM_WORKER_LABEL in labels) is bool(marker)


@pytest.mark.parametrize("tandem", [False, True])
async def test_the_registry_describes_the_worker(tandem: bool) -> None:
    state = StandinState()
    state.model_info.supported_features[:] = ["logprobs"]
    async with StandinServer(state, tandem=tandem) as server:
        registry = WorkerRegistry(sender=TrtllmSender())
        try:
            worker = await registry.add(server.url)
            client = registry.client(server.url)
            assert await client.engine_load(2.0) is None
            assert await client.health_check(2.0)
        finally:
            await registry.close()
    assert worker.model_id == "tiny-qwen3-vl" and worker.labels["protocol"] == "trtllm"
    assert worker.labels.get(TANDEM_WORKER_LABEL) == (__version__ if tandem else None)
    assert worker.language_model_only is tandem  # no "vision" feature
    assert worker.engine_load is None
    assert not any("Load" in m for m in state.methods)  # no load call reaches the worker


async def test_a_worker_naming_no_model_is_refused() -> None:
    state = StandinState()
    state.model_info.model_id = ""
    async with StandinServer(state) as server:
        client = TrtllmClient(server.url)
        try:
            with pytest.raises(ValueError, match="no model_id"):
                await client.describe(5.0)
        finally:
            await client.close()


async def test_tokenizer_and_one_abort_per_id() -> None:
    state = StandinState()
    async with StandinServer(state) as server:
        client = TrtllmClient(server.url)
        try:
            assert await client.get_tokenizer(5.0) == TOKENIZER_ZIP
            await client.abort(["a", "b", "c"])
        finally:
            await client.close()
    assert sorted(state.aborts) == ["a", "b", "c"]
    assert state.methods.count("/trtllm.TrtllmService/Abort") == 3


async def test_pixels_never_travel_beside_a_leg() -> None:
    client = TrtllmClient("127.0.0.1:9")
    try:
        with pytest.raises(ValueError, match="no pixel tensors"):
            client.generate(trpb.GenerateRequest(request_id="r"), pixels=object())  # type: ignore[arg-type]
    finally:
        await client.close()
