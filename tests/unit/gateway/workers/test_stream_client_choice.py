"""``--worker-stream-client``: the flag reaches the vLLM backend's clients, h2 by default."""

from __future__ import annotations

import pytest

from tandem.cli import build_parser
from tandem.gateway.backends.vllm.backend import VllmBackend
from tandem.gateway.backends.vllm.client import VllmClient
from tandem.gateway.cli import config_from_args
from tandem.gateway.config import GatewayConfig


def backend_for(*flags: str) -> VllmBackend:
    return VllmBackend.from_config(config_from_args(build_parser().parse_args(["gateway", *flags])))


async def test_h2_is_the_default_and_grpcio_is_chosen_by_the_flag() -> None:
    default, grpcio = backend_for(), backend_for("--worker-stream-client", "grpcio")
    h2_client, grpc_client = (
        default.sender.client("127.0.0.1:1"),
        grpcio.sender.client("127.0.0.1:1"),
    )
    assert isinstance(h2_client, VllmClient) and isinstance(grpc_client, VllmClient)
    try:
        assert h2_client._h2 is not None and grpc_client._h2 is None
    finally:
        await h2_client.close()
        await grpc_client.close()


async def test_a_target_that_is_not_host_port_stays_on_grpc_aio() -> None:
    client = VllmClient("unix:/tmp/tandem-no-such.sock")
    try:
        assert client._h2 is None
    finally:
        await client.close()


def test_an_unknown_client_is_refused() -> None:
    with pytest.raises(ValueError, match="--worker-stream-client must be one of h2, grpcio"):
        GatewayConfig(worker_stream_client="curl")  # type: ignore[arg-type]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["gateway", "--worker-stream-client", "curl"])
