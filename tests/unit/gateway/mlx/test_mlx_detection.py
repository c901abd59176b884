"""MLX found by asking, last in smg's order: a Tandem MLX worker (the real adapter over the
null engine, on a loopback gRPC server) answers only MLX's HealthCheck, so every earlier
protocol says UNIMPLEMENTED and ``--backend auto`` resolves to mlx; an MLX client asking a
worker of another protocol is told it does not speak MLX. The gateway reads the Tandem
worker's labels, marker and tokenizer; the flags MLX cannot honour are refused at start-up
and ``open_pair`` refuses PD with its code."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from tandem.engine.kv_store import KvStore
from tandem.engine.null import NullEngine, null_shape
from tandem.errors import TandemError
from tandem.gateway.backend import detect_protocol, make_backend, resolved_backend
from tandem.gateway.backends.mlx.client import MlxClient
from tandem.gateway.config import GatewayConfig
from tandem.models.info import load_model_info
from tandem.wire.tokenspeed import tpb, tpb_grpc
from tandem.wire.worker_marker import TANDEM_WORKER_LABEL
from tandem.worker.adapters import adapter_for
from tandem.worker.config import WorkerConfig
from tandem.worker.context import WorkerContext
from tandem.worker.kv_channel import KvChannelClient
from tandem.worker.marker import server_interceptors

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
async def mlx_url(qwen_meta_dir: Path) -> AsyncIterator[str]:
    config = WorkerConfig(model=str(qwen_meta_dir), protocol="mlx", engine="null")
    model = load_model_info(qwen_meta_dir)
    engine = NullEngine(model, KvStore(null_shape(model)))
    client = KvChannelClient(engine.shape)
    adapter = adapter_for("mlx")
    server = grpc.aio.server(interceptors=server_interceptors(False, adapter.server_info_method))
    port = server.add_insecure_port("127.0.0.1:0")
    adapter.serve(
        WorkerContext(config, qwen_meta_dir, model, engine, client, ("127.0.0.1", port), port),
        server,
    )
    engine.start()
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await client.close()
        await server.stop(0)
        engine.stop()


class _TokenSpeed(tpb_grpc.TokenSpeedSchedulerServicer):
    async def HealthCheck(self, request, context):
        return tpb.HealthCheckResponse(healthy=True)


@pytest.fixture
async def tokenspeed_url() -> AsyncIterator[str]:
    server = grpc.aio.server()
    tpb_grpc.add_TokenSpeedSchedulerServicer_to_server(_TokenSpeed(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(0)


async def test_a_tandem_mlx_worker_is_detected_as_mlx(mlx_url: str) -> None:
    assert await detect_protocol(mlx_url, 5.0) == "mlx"
    resolved = await resolved_backend(GatewayConfig(worker_urls=[mlx_url]))
    assert resolved.backend == "mlx" and make_backend(resolved).name == "mlx"


async def test_other_protocols_do_not_speak_mlx(tokenspeed_url: str) -> None:
    assert await detect_protocol(tokenspeed_url, 5.0) == "tokenspeed"
    client = MlxClient(tokenspeed_url)
    try:
        assert not await client.speaks_protocol(5.0)
    finally:
        await client.close()


async def test_the_gateway_reads_a_tandem_mlx_worker(mlx_url: str, qwen_meta_dir: Path) -> None:
    client = MlxClient(mlx_url)
    try:
        description = await client.describe(5.0)
        labels = description.labels
        assert description.model_id == qwen_meta_dir.name  # --served-model-name unset
        assert labels[TANDEM_WORKER_LABEL] and labels["server_type"] == "tandem-mlx-grpc"
        assert labels["supports_vision"] == "false" and labels["protocol"] == "mlx"
        model = load_model_info(qwen_meta_dir)
        assert labels["max_context_length"] == str(model.max_context)
        assert "active_requests" not in labels and "uptime_seconds" not in labels
        assert await client.health_check(5.0)
        archive = await client.get_tokenizer(5.0)
        assert archive.startswith(b"PK")  # a zip, its sha256 checked by the client
    finally:
        await client.close()


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"pd_disaggregation": True, "prefill_urls": ["a:1"], "decode_urls": ["b:2"]}, "no PD"),
        ({"mm_processing": "worker"}, "carries no media URLs"),
        ({"mm_tensor_transport": "shm"}, "carries no pixel tensors"),
    ],
)
def test_flags_mlx_cannot_honour_are_refused_at_start(fields: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        GatewayConfig(backend="mlx", **fields)


async def test_open_pair_refuses_pd_with_its_code() -> None:
    backend = make_backend(GatewayConfig(backend="mlx"))
    with pytest.raises(TandemError) as info:
        await backend.open_pair(None, None, None, 1.0, parallel=True)  # type: ignore[arg-type]
    assert (info.value.status, info.value.code) == (400, "runtime_pd_not_supported")
