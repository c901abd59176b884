"""KV connector modes, tags and the handoff table (docs/pd-contract.md §8)."""

from __future__ import annotations

import json
import logging
import uuid

import pytest

from tandem.gateway.backends.vllm import connector
from tandem.gateway.backends.vllm.connector import (
    KvKind,
    KvMode,
    decode_params_for_minted,
    handoff,
    identity_solicited,
    kv_mode_for_worker,
    mint_transfer_id,
    mints_transfer_id,
    prefill_tag,
)
from tandem.gateway.workers.worker import Worker
from tandem.wire.proto import GenerateRequest

NIXL = KvMode(KvKind.NIXL, "127.0.0.1", 50051)
TANDEM = KvMode(KvKind.TANDEM, "127.0.0.1", 50051)
PASSTHROUGH = KvMode(KvKind.PASSTHROUGH, "127.0.0.1", 50051)
MOONCAKE = KvMode(KvKind.MOONCAKE, "127.0.0.1", 8998, "engine-a")
LEGACY_MOONCAKE = KvMode(KvKind.MOONCAKE, "127.0.0.1", 8998, None)
PREFILL_JSON = '{"do_remote_prefill":true,"transfer_id":"t-1","remote_host":"127.0.0.1"}'


def prefill_worker(connector_name: str, url: str = "127.0.0.1:50051", **labels: str) -> Worker:
    return Worker(url, "prefill", {"kv_connector": connector_name, **labels}, "m")


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_case16_nixl_and_tandem_relay_tag_is_exactly_two_keys() -> None:
    expected = '{"do_remote_decode":true,"do_remote_prefill":false}'
    assert prefill_tag(NIXL, True, None) == expected
    assert prefill_tag(TANDEM, True, None) == expected


def test_no_tag_without_relay_or_for_untagged_modes() -> None:
    assert prefill_tag(NIXL, False, None) is None  # n > 1: single-consumer KV
    assert prefill_tag(TANDEM, False, None) is None
    assert prefill_tag(PASSTHROUGH, True, None) is None
    assert prefill_tag(LEGACY_MOONCAKE, True, None) is None
    assert prefill_tag(MOONCAKE, False, None) is None


def test_case17_mooncake_minted_params() -> None:
    tid = mint_transfer_id()
    prefill = json.loads(prefill_tag(MOONCAKE, True, tid) or "")
    assert prefill == {"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": tid}
    decode = json.loads(decode_params_for_minted(MOONCAKE, tid))
    assert decode == {
        "do_remote_decode": False,
        "do_remote_prefill": True,
        "transfer_id": tid,
        "remote_engine_id": "engine-a",
        "remote_bootstrap_addr": "http://127.0.0.1:8998",
    }


def test_tandem_minted_params_name_the_prefill_grpc_address() -> None:
    mode = kv_mode_for_worker(prefill_worker("TandemConnector", "127.0.0.1:50123"))
    assert (mode.kind, mode.host, mode.port) == (KvKind.TANDEM, "127.0.0.1", 50123)
    prefill = json.loads(prefill_tag(mode, True, "xfer-1") or "")
    assert prefill == {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "transfer_id": "xfer-1",
    }
    assert json.loads(decode_params_for_minted(mode, "xfer-1")) == {
        "do_remote_decode": False,
        "do_remote_prefill": True,
        "transfer_id": "xfer-1",
        "remote_host": "127.0.0.1",
        "remote_port": 50123,
    }


@pytest.mark.parametrize("mode", [NIXL, PASSTHROUGH, LEGACY_MOONCAKE])
def test_modes_without_minted_ids_refuse_one(mode: KvMode) -> None:
    assert not mints_transfer_id(mode, True)
    with pytest.raises(ValueError):
        prefill_tag(mode, True, "xfer-1")
    with pytest.raises(ValueError):
        decode_params_for_minted(mode, "xfer-1")


def test_minting_needs_relay_and_a_capable_worker() -> None:
    assert mints_transfer_id(MOONCAKE, True) and mints_transfer_id(TANDEM, True)
    assert not mints_transfer_id(MOONCAKE, False)
    first, second = mint_transfer_id(), mint_transfer_id()
    assert first.startswith("xfer-") and first != second
    uuid.UUID(first.removeprefix("xfer-"))


def test_case18_mooncake_engine_id_and_port() -> None:
    mode = kv_mode_for_worker(prefill_worker("MooncakeConnector", kv_engine_id="eng"))
    assert mode == KvMode(KvKind.MOONCAKE, "127.0.0.1", 8998, "eng")
    labelled = prefill_worker("MooncakeConnector", kv_engine_id="eng", bootstrap_port="9100")
    assert kv_mode_for_worker(labelled).port == 9100
    assert kv_mode_for_worker(prefill_worker("MooncakeConnector")).engine_id is None
    empty = prefill_worker("MooncakeConnector", kv_engine_id="")
    assert kv_mode_for_worker(empty).engine_id is None
    one = prefill_worker("MooncakeConnector", kv_engine_id="eng", data_parallel_size="1")
    assert kv_mode_for_worker(one, dp_rank=0).engine_id == "eng"


def test_case18_mooncake_data_parallel_ranks(caplog: pytest.LogCaptureFixture) -> None:
    dp2 = prefill_worker("MooncakeConnector", kv_engine_id="eng", data_parallel_size="2")
    assert kv_mode_for_worker(dp2, dp_rank=1).engine_id == "eng_dp1"
    assert kv_mode_for_worker(dp2).engine_id is None  # unpinned: the owning rank is unknown
    for bad in ("x", "0", "-2"):
        caplog.clear()
        worker = prefill_worker("MooncakeConnector", kv_engine_id="eng", data_parallel_size=bad)
        with caplog.at_level(logging.WARNING):
            assert kv_mode_for_worker(worker, dp_rank=1).engine_id is None
        assert any("data_parallel_size" in m for m in warnings_of(caplog)), bad


def test_case18_connector_names(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(connector, "_passthrough_warned", False)
    assert kv_mode_for_worker(prefill_worker("NixlConnector")).kind is KvKind.NIXL
    with caplog.at_level(logging.WARNING):
        assert kv_mode_for_worker(prefill_worker("SomethingElse")).kind is KvKind.PASSTHROUGH
        assert kv_mode_for_worker(prefill_worker("")).kind is KvKind.PASSTHROUGH
    assert warnings_of(caplog) == [
        "vLLM PD: no kv_connector detected on prefill worker; KV transfer params will only "
        "be relayed if the engine returns them"
    ]


def test_worker_url_forms() -> None:
    ipv6 = kv_mode_for_worker(prefill_worker("TandemConnector", "[::1]:50051"))
    assert (ipv6.host, ipv6.port) == ("::1", 50051)
    schemed = kv_mode_for_worker(prefill_worker("TandemConnector", "grpc://localhost:7000"))
    assert (schemed.host, schemed.port) == ("localhost", 7000)
    mooncake = KvMode(KvKind.MOONCAKE, "::1", 8998, "e")
    assert json.loads(decode_params_for_minted(mooncake, "x"))["remote_bootstrap_addr"] == (
        "http://[::1]:8998"
    )


def test_handoff_minted_id_writes_decode_params() -> None:
    for mode in (MOONCAKE, TANDEM):
        leg = GenerateRequest(request_id="r")
        assert handoff(mode, True, None, "xfer-1", leg) is True
        assert leg.kv_transfer_params_json == decode_params_for_minted(mode, "xfer-1")
        assert not leg.HasField("kv_transfer_params")


@pytest.mark.parametrize("relay", [True, False])
def test_handoff_legacy_mooncake_gets_host_and_port(relay: bool) -> None:
    for mode in (LEGACY_MOONCAKE, MOONCAKE):  # no engine id, or n > 1 (nothing minted)
        leg = GenerateRequest(request_id="r")
        assert handoff(mode, relay, None, None, leg) is True
        assert (leg.kv_transfer_params.remote_host, leg.kv_transfer_params.remote_port) == (
            "127.0.0.1",
            8998,
        )
        assert not leg.HasField("kv_transfer_params_json")


def test_handoff_leaves_one_wire_form_on_the_leg() -> None:
    stale_json = GenerateRequest(request_id="r", kv_transfer_params_json='{"old":1}')
    assert handoff(LEGACY_MOONCAKE, True, None, None, stale_json) is True
    assert not stale_json.HasField("kv_transfer_params_json")
    stale_typed = GenerateRequest(request_id="r")
    stale_typed.kv_transfer_params.remote_host = "127.0.0.1"
    stale_typed.kv_transfer_params.remote_port = 1
    assert handoff(NIXL, True, PREFILL_JSON, None, stale_typed) is True
    assert not stale_typed.HasField("kv_transfer_params")


@pytest.mark.parametrize("mode", [NIXL, PASSTHROUGH, TANDEM])
def test_handoff_relays_prefill_json_verbatim(mode: KvMode) -> None:
    leg = GenerateRequest(request_id="r")
    assert handoff(mode, True, PREFILL_JSON, None, leg) is True
    assert leg.kv_transfer_params_json == PREFILL_JSON


@pytest.mark.parametrize("mode", [NIXL, TANDEM])
def test_handoff_nothing_returned_warns_and_counts(
    mode: KvMode, caplog: pytest.LogCaptureFixture
) -> None:
    failures: list[int] = []
    for empty in (None, ""):
        leg = GenerateRequest(request_id="req-k")
        with caplog.at_level(logging.WARNING):
            handed = handoff(
                mode, True, empty, None, leg, on_transfer_failure=lambda: failures.append(1)
            )
        assert handed is False
        assert not leg.HasField("kv_transfer_params_json")
    assert failures == [1, 1]
    messages = warnings_of(caplog)
    assert len(messages) == 2
    assert all("prefill returned no kv_transfer_params" in m and "req-k" in m for m in messages)


def test_handoff_otherwise_gives_nothing_silently(caplog: pytest.LogCaptureFixture) -> None:
    failures: list[int] = []
    cases = [(PASSTHROUGH, True, None), (NIXL, False, PREFILL_JSON), (PASSTHROUGH, False, None)]
    with caplog.at_level(logging.WARNING):
        for mode, relay, returned in cases:
            leg = GenerateRequest(request_id="r")
            assert (
                handoff(
                    mode, relay, returned, None, leg, on_transfer_failure=lambda: failures.append(1)
                )
                is False
            )
            assert leg == GenerateRequest(request_id="r")
    assert failures == []
    assert warnings_of(caplog) == []


def test_identity_is_solicited_only_from_a_tagged_prefill() -> None:
    assert identity_solicited(MOONCAKE, True, "xfer-1")
    assert identity_solicited(NIXL, True, None)
    assert identity_solicited(TANDEM, True, None)
    assert not identity_solicited(NIXL, False, None)
    assert not identity_solicited(LEGACY_MOONCAKE, True, None)
    assert not identity_solicited(PASSTHROUGH, True, None)
