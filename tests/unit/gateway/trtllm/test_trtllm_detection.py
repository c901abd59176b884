"""TensorRT-LLM found by asking, the flags this protocol cannot honour refused at start-up,
and the backend's guards: no PD pair, no fan-out (n > 1 is one request)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from tandem.errors import TandemError
from tandem.gateway.backend import DETECTION_ORDER, detect_protocol, make_backend, resolved_backend
from tandem.gateway.backends.trtllm.backend import TrtllmBackend
from tandem.gateway.config import GatewayConfig
from tandem.gateway.pd.selection import Pair
from tandem.gateway.workers.registry import WorkerRegistry
from tandem.gateway.workers.worker import Worker
from tandem.wire.trtllm import trpb, trpb_grpc


class _HealthOnly(trpb_grpc.TrtllmServiceServicer):
    """Stands in for a TensorRT-LLM worker (the real engine needs CUDA and cannot run
    here): it serves ``trtllm.TrtllmService`` with only ``HealthCheck``, answering a status
    that is not "OK", and no other service, so SGLang's and vLLM's HealthCheck answer
    UNIMPLEMENTED first."""

    def __init__(self) -> None:
        self.asked = 0

    async def HealthCheck(self, request: Any, context: Any) -> trpb.HealthCheckResponse:
        self.asked += 1
        return trpb.HealthCheckResponse(status="degraded: warming up")


@pytest.fixture
async def health_only() -> AsyncIterator[tuple[str, _HealthOnly]]:
    servicer = _HealthOnly()
    server = grpc.aio.server()
    trpb_grpc.add_TrtllmServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        await server.stop(0)


def test_trtllm_is_asked_third() -> None:
    assert DETECTION_ORDER.index("trtllm") == 2
    assert DETECTION_ORDER[:2] == ("sglang", "vllm")


async def test_trtllm_is_detected_even_when_not_healthy(
    health_only: tuple[str, _HealthOnly],
) -> None:
    url, servicer = health_only
    assert await detect_protocol(url, 5.0) == "trtllm"
    resolved = await resolved_backend(GatewayConfig(worker_urls=[url]))
    assert resolved.backend == "trtllm"
    backend = make_backend(resolved)
    assert isinstance(backend, TrtllmBackend) and backend.name == "trtllm"
    assert backend.keeps_image_sources and backend.sender.name == "trtllm"
    assert servicer.asked == 2  # once per detection, after the others said UNIMPLEMENTED


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        ({"mm_processing": "worker"}, "carries no media URLs"),
        ({"mm_tensor_transport": "shm"}, "carries no pixel tensors"),
        (
            {
                "pd_disaggregation": True,
                "prefill_urls": ["127.0.0.1:1"],
                "decode_urls": ["127.0.0.1:2"],
            },
            "runtime_pd_not_supported",
        ),
    ],
)
def test_flags_this_protocol_cannot_honour_are_refused(flags: dict[str, Any], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        GatewayConfig(backend="trtllm", **flags)
    GatewayConfig(backend="trtllm", mm_processing="router", mm_tensor_transport="inline")


async def test_a_pd_pair_is_refused_and_n_is_never_fanned_out() -> None:
    backend = TrtllmBackend()
    leg = trpb.GenerateRequest(request_id="r")
    leg.sampling_config.num_return_sequences = 3
    assert backend.fanout(leg, parallel=True) is None
    assert backend.fanout(leg, parallel=False) is None
    workers = [Worker("127.0.0.1:1", role, {}, "m") for role in ("prefill", "decode")]
    pair = Pair(workers[0], workers[1], lambda ok: None, lambda ok: None)
    registry = WorkerRegistry()
    try:
        with pytest.raises(TandemError) as info:
            await backend.open_pair(None, pair, registry, 5.0, parallel=True)  # type: ignore[arg-type]
    finally:
        await registry.close()
    assert (info.value.status, info.value.code) == (400, "runtime_pd_not_supported")
    assert "trtllm" in info.value.message


async def test_worker_side_media_refs_are_refused() -> None:
    with pytest.raises(TandemError) as info:
        await TrtllmBackend().forward_media_refs(None, GatewayConfig(), [], None)  # type: ignore[arg-type]
    assert (info.value.status, info.value.code) == (400, "multimodal_not_supported")
