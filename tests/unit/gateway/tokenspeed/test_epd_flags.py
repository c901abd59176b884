"""``--epd-disaggregation --encode URL [BOOTSTRAP_PORT]…`` as smg spells them."""

from __future__ import annotations

import pytest

from tandem.cli import build_parser
from tandem.gateway.backend import make_backend
from tandem.gateway.backends.tokenspeed.backend import TokenSpeedBackend
from tandem.gateway.cli import config_from_args
from tandem.gateway.config import GatewayConfig

PD = ["--prefill", "127.0.0.1:7001", "--decode", "127.0.0.1:7002"]


def config_of(*flags: str) -> GatewayConfig:
    return config_from_args(build_parser().parse_args(["gateway", *flags]))


def test_encode_urls_take_ports_and_imply_pd() -> None:
    config = config_of(
        "--epd-disaggregation",
        "--encode",
        "grpc://127.0.0.1:7101",
        "9100",
        "127.0.0.1:7102",
        "--encode-policy",
        "round_robin",
        "--backend",
        "tokenspeed",
        *PD,
    )
    assert config.encode_urls == ["127.0.0.1:7101", "127.0.0.1:7102"]
    assert config.encode_bootstrap_ports == {"127.0.0.1:7101": 9100}
    assert config.pd_disaggregation and config.encode_policy == "round_robin"
    backend = make_backend(config)
    assert isinstance(backend, TokenSpeedBackend) and backend.encode is not None
    plain = make_backend(config_of("--pd-disaggregation", "--backend", "tokenspeed", *PD))
    assert isinstance(plain, TokenSpeedBackend) and plain.encode is None


@pytest.mark.parametrize(
    ("flags", "match"),
    [
        (["--pd-disaggregation", "--encode", "a:1", *PD], "--encode needs --epd"),
        (["--epd-disaggregation", *PD], "at least one --encode"),
        (["--epd-disaggregation", "--encode", "a:1", "--backend", "sglang", *PD], "tokenspeed"),
        (["--epd-disaggregation", "--encode", "a:1"], "at least one --prefill"),
        (["--epd-disaggregation", "--encode", "9100", *PD], "follows no URL"),
    ],
)
def test_incomplete_or_wrong_epd_flags_are_refused(flags: list[str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        config_of(*flags)
