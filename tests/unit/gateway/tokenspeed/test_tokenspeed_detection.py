"""TokenSpeed found by asking: after SGLang and vLLM answer UNIMPLEMENTED, TokenSpeed's
HealthCheck names the protocol (an encode worker's discovery copy too); loads, and an
encode worker's empty ones; on real loopback gRPC servers serving only these calls (the
real worker's answers are tests/integration/test_gateway_tokenspeed.py's)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from tandem.gateway.backend import detect_protocol, make_backend, resolved_backend
from tandem.gateway.backends.tokenspeed.client import TokenSpeedClient
from tandem.gateway.config import GatewayConfig
from tandem.gateway.workers.worker import EngineLoad
from tandem.wire.tokenspeed import tpb, tpb_grpc


class _TokenSpeed(tpb_grpc.TokenSpeedSchedulerServicer):
    def __init__(self, loads: list[tpb.SchedulerLoad]) -> None:
        self._loads = loads

    async def HealthCheck(self, request, context):
        return tpb.HealthCheckResponse(healthy=True, message="shallow")

    async def GetLoads(self, request, context):
        return tpb.GetLoadsResponse(dp_rank_count=len(self._loads), loads=self._loads)


async def _serve(servicer: _TokenSpeed) -> AsyncIterator[str]:
    server = grpc.aio.server()
    tpb_grpc.add_TokenSpeedSchedulerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(0)


@pytest.fixture
async def scheduler_url() -> AsyncIterator[str]:
    loads = [tpb.SchedulerLoad(dp_rank=0, num_running_reqs=3, num_waiting_reqs=2)]
    async for url in _serve(_TokenSpeed(loads)):
        yield url


@pytest.fixture
async def encoder_url() -> AsyncIterator[str]:
    async for url in _serve(_TokenSpeed([])):
        yield url


async def test_tokenspeed_is_detected_after_the_others_said_unimplemented(
    scheduler_url: str,
) -> None:
    assert await detect_protocol(scheduler_url, 5.0) == "tokenspeed"
    resolved = await resolved_backend(GatewayConfig(worker_urls=[scheduler_url]))
    assert resolved.backend == "tokenspeed" and make_backend(resolved).name == "tokenspeed"


async def test_loads_and_an_encode_workers_empty_ones(scheduler_url: str, encoder_url: str) -> None:
    scheduler = TokenSpeedClient(scheduler_url)
    encoder = TokenSpeedClient(encoder_url)
    try:
        assert await scheduler.engine_load(5.0) == EngineLoad(running=3, waiting=2)
        assert await encoder.engine_load(5.0) is None  # no load: not zero load
    finally:
        await scheduler.close()
        await encoder.close()


def test_worker_side_media_and_shm_cannot_go_to_tokenspeed_workers() -> None:
    with pytest.raises(ValueError, match="tokenspeed workers take preprocessed pixels"):
        GatewayConfig(backend="tokenspeed", mm_processing="worker")
    with pytest.raises(ValueError, match="inline only"):
        GatewayConfig(backend="tokenspeed", mm_tensor_transport="shm")
