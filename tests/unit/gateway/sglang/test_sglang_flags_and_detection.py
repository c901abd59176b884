"""``--prefill URL [BOOTSTRAP_PORT]`` as smg reads it, ``--backend``, and the protocol a
worker speaks found by asking it, on real loopback gRPC servers (one serving SGLang's
service, one vLLM's; each answers only HealthCheck, which is all detection asks)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from tandem.cli import build_parser
from tandem.gateway import backend as backend_module
from tandem.gateway.backend import detect_protocol, make_backend, resolved_backend
from tandem.gateway.backends.sglang.client import SglangClient
from tandem.gateway.backends.vllm.client import VllmClient
from tandem.gateway.cli import config_from_args
from tandem.gateway.config import GatewayConfig
from tandem.gateway.workers.worker import EngineLoad
from tandem.wire.proto import pb, pb_grpc
from tandem.wire.sglang import spb, spb_grpc


def gateway_args(*flags: str):
    return build_parser().parse_args(["gateway", *flags])


def test_a_port_after_a_prefill_url_is_its_bootstrap_port() -> None:
    config = config_from_args(
        gateway_args(
            "--pd-disaggregation",
            "--prefill",
            "grpc://127.0.0.1:7001",
            "8998",
            "127.0.0.1:7002",
            "none",
            "127.0.0.1:7003",
            "--prefill",
            "[::1]:7004",
            "9100",
            "--decode",
            "127.0.0.1:7005",
            "--backend",
            "sglang",
        )
    )
    assert config.prefill_urls == [
        "127.0.0.1:7001",
        "127.0.0.1:7002",
        "127.0.0.1:7003",
        "[::1]:7004",
    ]
    assert config.prefill_bootstrap_ports == {
        "127.0.0.1:7001": 8998,
        "127.0.0.1:7002": None,
        "[::1]:7004": 9100,
    }
    assert config.backend == "sglang" and make_backend(config).name == "sglang"


@pytest.mark.parametrize(
    ("words", "match"),
    [
        (["8998"], "follows no URL"),
        (["a:1", "1", "2"], "follows no URL"),
        (["a:1", "70000"], "1..65535"),
    ],
)
def test_a_stray_or_bad_bootstrap_port_is_refused(words: list[str], match: str) -> None:
    args = gateway_args("--pd-disaggregation", "--prefill", *words, "--decode", "d:1")
    with pytest.raises(ValueError, match=match):
        config_from_args(args)


def test_worker_side_media_cannot_go_to_sglang_workers() -> None:
    with pytest.raises(ValueError, match="preprocessed pixels"):
        GatewayConfig(backend="sglang", mm_processing="worker")
    with pytest.raises(ValueError, match="inline only"):
        GatewayConfig(backend="sglang", mm_tensor_transport="shm")
    assert make_backend(GatewayConfig()).name == "vllm"  # auto, unresolved


class _Sglang(spb_grpc.SglangSchedulerServicer):
    async def HealthCheck(self, request, context):
        return spb.HealthCheckResponse(healthy=False, message="starting")  # still SGLang

    async def GetLoads(self, request, context):
        assert "core" in request.include  # what smg asks for too
        ranks = [
            spb.SchedulerLoad(dp_rank=r, num_running_reqs=2, num_waiting_reqs=r) for r in (0, 1)
        ]
        return spb.GetLoadsResponse(dp_rank_count=2, loads=ranks)


class _Vllm(pb_grpc.VllmEngineServicer):
    async def HealthCheck(self, request, context):
        return pb.HealthCheckResponse(healthy=True)


async def _serve(add) -> AsyncIterator[str]:
    server = grpc.aio.server()
    add(server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(0)


@pytest.fixture
async def sglang_url() -> AsyncIterator[str]:
    async for url in _serve(lambda s: spb_grpc.add_SglangSchedulerServicer_to_server(_Sglang(), s)):
        yield url


@pytest.fixture
async def vllm_url() -> AsyncIterator[str]:
    async for url in _serve(lambda s: pb_grpc.add_VllmEngineServicer_to_server(_Vllm(), s)):
        yield url


async def test_detection_asks_sglang_first_then_vllm(sglang_url: str, vllm_url: str) -> None:
    assert await detect_protocol(sglang_url, 5.0) == "sglang"
    assert await detect_protocol(vllm_url, 5.0) == "vllm"
    auto = GatewayConfig(worker_urls=[sglang_url])
    assert (await resolved_backend(auto)).backend == "sglang"
    pinned = GatewayConfig(worker_urls=[sglang_url], backend="vllm")
    assert (await resolved_backend(pinned)).backend == "vllm"  # --backend overrides


async def test_a_worker_that_is_not_there_stops_the_start_with_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(backend_module, "DETECT_TIMEOUT_S", 0.5)
    with pytest.raises(ConnectionError, match="did not answer"):
        await detect_protocol("127.0.0.1:1", 0.5)
    with pytest.raises(SystemExit, match="--backend auto"):
        await resolved_backend(GatewayConfig(worker_urls=["127.0.0.1:1"]))


async def test_engine_loads_are_summed_over_ranks_and_absent_ones_not_asked_again(
    sglang_url: str, vllm_url: str
) -> None:
    sglang = SglangClient(sglang_url)
    vllm = VllmClient(vllm_url)  # its worker has no GetLoads: UNIMPLEMENTED
    try:
        assert await sglang.engine_load(5.0) == EngineLoad(running=4, waiting=1)
        assert await vllm.engine_load(5.0) is None
        assert await vllm.engine_load(5.0) is None
    finally:
        await sglang.close()
        await vllm.close()
