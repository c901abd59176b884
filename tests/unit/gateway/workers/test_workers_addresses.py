"""Worker URLs at the gateway: one spelling per worker, IPv6 in brackets, no guessing."""

from __future__ import annotations

import pytest

from tandem.cli import build_parser
from tandem.gateway.backends.vllm.sender import VllmSender
from tandem.gateway.cli import config_from_args
from tandem.gateway.workers.registry import WorkerRegistry, normalize_url


def gateway_args(*flags: str):
    return build_parser().parse_args(["gateway", *flags])


def test_worker_urls_are_written_one_way() -> None:
    assert normalize_url("grpc://[::1]:50051/") == "[::1]:50051"
    assert normalize_url("[::1]:50051") == "[::1]:50051"
    assert normalize_url("grpc://localhost:7000") == "localhost:7000"


def test_flags_bracket_ipv6_and_refuse_an_ambiguous_address() -> None:
    config = config_from_args(
        gateway_args(
            "--host",
            "[::1]",
            "--pd-disaggregation",
            "--prefill",
            "grpc://[::1]:7001",
            "--decode",
            "[::1]:7002/",
        )
    )
    assert config.host == "::1"
    assert (config.prefill_urls, config.decode_urls) == (["[::1]:7001"], ["[::1]:7002"])
    with pytest.raises(ValueError, match="ambiguous"):
        config_from_args(gateway_args("--worker-urls", "::1:7001"))


async def test_registry_refuses_an_ambiguous_url_and_finds_nothing_for_one() -> None:
    registry = WorkerRegistry(sender=VllmSender(), connect_timeout_s=0.5)
    with pytest.raises(ValueError, match="ambiguous"):
        await registry.add("::1:7001")
    # Lookups of malformed text answer "not there" instead of raising.
    assert registry.get("::1:7001") is None
    assert "::1:7001" not in registry
    assert registry.remove("::1:7001") is False
    await registry.close()
