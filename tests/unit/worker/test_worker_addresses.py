"""The worker's addresses: the host it tells others to dial is never a wildcard, and IPv6
hosts are bracketed in every address it writes or dials (docs/operations.md, "Addresses")."""

from __future__ import annotations

import json

import pytest

from tandem.cli import build_parser, main
from tandem.worker.cli import config_from_args
from tandem.worker.config import WorkerConfig
from tandem.worker.handoff import RemoteKv, export_params


def worker_config(*flags: str) -> WorkerConfig:
    return config_from_args(build_parser().parse_args(["worker", *flags]))


def test_advertise_host_defaults_to_the_bind_host() -> None:
    assert worker_config().dial_host == "127.0.0.1"
    assert worker_config("--host", "::1").dial_host == "::1"
    assert worker_config("--host", "[::1]").host == "::1"  # one spelling, brackets dropped
    config = worker_config("--host", "127.0.0.1", "--advertise-host", "localhost")
    assert (config.host, config.dial_host) == ("127.0.0.1", "localhost")


@pytest.mark.parametrize("wildcard", ["0.0.0.0", "::", "[::]", ""])
def test_a_wildcard_bind_needs_an_advertise_host(wildcard: str) -> None:
    with pytest.raises(ValueError, match="--advertise-host"):
        worker_config("--host", wildcard)
    # With one, the wildcard is only the bind address (nothing is bound by this test).
    config = worker_config("--host", wildcard, "--advertise-host", "localhost")
    assert config.dial_host == "localhost"


@pytest.mark.parametrize("bad", ["0.0.0.0", "::", "localhost:50051", "a/b"])
def test_a_bad_advertise_host_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="--advertise-host"):
        worker_config("--advertise-host", bad)


def test_the_command_refuses_a_wildcard_with_a_message_before_binding(monkeypatch) -> None:
    import tandem.worker.server as server

    async def must_not_serve(config: WorkerConfig) -> None:
        raise AssertionError(f"the worker would bind {config.host!r}")

    monkeypatch.setattr(server, "serve", must_not_serve)
    with pytest.raises(SystemExit) as info:
        main(["worker", "--host", "0.0.0.0", "--engine", "null", "--log-level", "error"])
    message = str(info.value.code)
    assert "--advertise-host" in message and "0.0.0.0" in message, message


def test_kv_params_carry_a_bare_host_and_the_decode_dials_it_bracketed() -> None:
    params = json.loads(export_params("t1", "::1", 50051, "e", 5))
    assert (params["remote_host"], params["remote_port"]) == ("::1", 50051)
    assert RemoteKv.from_params(params).address == "[::1]:50051"
    bracketed = {**params, "remote_host": "[::1]"}
    assert RemoteKv.from_params(bracketed).address == "[::1]:50051"
    named = {**params, "remote_host": "localhost"}
    assert RemoteKv.from_params(named).address == "localhost:50051"


def test_a_bootstrap_address_with_ipv6_is_parsed() -> None:
    params = {"do_remote_prefill": True, "transfer_id": "t"}
    remote = RemoteKv.from_params({**params, "remote_bootstrap_addr": "http://[::1]:8998"})
    assert remote.address == "[::1]:8998"
    remote = RemoteKv.from_params({**params, "remote_bootstrap_addr": "http://localhost:8998"})
    assert remote.address == "localhost:8998"
    with pytest.raises(ValueError, match="remote_bootstrap_addr"):
        RemoteKv.from_params({**params, "remote_bootstrap_addr": "http://::1:8998"})
    with pytest.raises(ValueError, match="remote_host"):
        RemoteKv.from_params({**params, "remote_host": "a/b", "remote_port": 1})
