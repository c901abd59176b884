"""``--protocol`` and SGLang's ``--disaggregation-bootstrap-port``: parsed, validated, and
the adapter each protocol names."""

from __future__ import annotations

import pytest

from tandem.cli import build_parser
from tandem.wire.worker_marker import GET_SERVER_INFO_METHOD
from tandem.worker.adapters import adapter_for
from tandem.worker.cli import config_from_args
from tandem.worker.config import WorkerConfig


def worker_config(*flags: str) -> WorkerConfig:
    return config_from_args(build_parser().parse_args(["worker", *flags]))


def test_the_protocol_and_bootstrap_port_flags() -> None:
    assert (worker_config().protocol, worker_config().bootstrap_port) == ("vllm", None)
    config = worker_config("--protocol", "sglang", "--disaggregation-bootstrap-port", "8998")
    assert (config.protocol, config.bootstrap_port) == ("sglang", 8998)
    assert worker_config("--kv-pull-wait-secs", "0.5").kv_pull_wait_s == 0.5


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--disaggregation-bootstrap-port", "8998"], "needs --protocol sglang"),
        (["--protocol", "sglang", "--disaggregation-bootstrap-port", "0"], "1..65535"),
        (["--protocol", "sglang", "--disaggregation-bootstrap-port", "65536"], "1..65535"),
        (
            ["--protocol", "sglang", "--port", "9000", "--disaggregation-bootstrap-port", "9000"],
            "is the --port already",
        ),
        (["--kv-pull-wait-secs", "-1"], "--kv-pull-wait-secs"),
    ],
)
def test_bad_values_are_refused(flags: list[str], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        worker_config(*flags)


def test_each_protocol_has_its_adapter() -> None:
    vllm, sglang = adapter_for("vllm"), adapter_for("sglang")
    assert vllm.server_info_method == GET_SERVER_INFO_METHOD
    assert sglang.server_info_method == "/sglang.grpc.scheduler.SglangScheduler/GetServerInfo"
    assert callable(vllm.serve) and callable(sglang.serve)
    with pytest.raises(ValueError, match="unknown worker protocol"):
        adapter_for("nope")  # type: ignore[arg-type]
