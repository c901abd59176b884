"""Which PD leg a TokenSpeed request is on a worker, and where its prefill's KV lives."""

from __future__ import annotations

import pytest

from tandem.wire.tokenspeed import room_transfer_id, tpb
from tandem.worker.tokenspeed.bootstrap import (
    bootstrap_of,
    check_leg,
    leg_of,
    prefill_kv,
    refuse_embeddings_on_decode,
)


def leg(host: str = "127.0.0.1", port: int = 8998, room: int = 0) -> tpb.GenerateRequest:
    req = tpb.GenerateRequest(request_id="rid")
    info = req.kv_bootstrap_info
    info.bootstrap_host, info.bootstrap_port, info.bootstrap_room = host, port, room
    return req


def test_the_role_says_which_leg_and_both_refuses_rooms() -> None:
    plain = tpb.GenerateRequest(request_id="rid")
    for role in ("prefill", "decode", "both"):
        assert check_leg(bootstrap_of(plain), role) == "aggregated"
        assert leg_of(plain, role) == "aggregated"
    boot = bootstrap_of(leg())
    assert check_leg(boot, "prefill") == "prefill" and check_leg(boot, "decode") == "decode"
    for role in ("both", "encode"):
        with pytest.raises(ValueError, match="not disaggregated"):
            check_leg(boot, role)  # type: ignore[arg-type]
    assert leg_of(leg(), "both") == "aggregated"  # counted there, then refused


def test_encode_bootstrap_info_is_refused_on_a_decode_leg_only() -> None:
    req = leg()
    req.encode_bootstrap_info.items.add(item_index=0, bootstrap_host="e", bootstrap_port=1)
    with pytest.raises(ValueError, match="encode_bootstrap_info sent on a decode leg"):
        refuse_embeddings_on_decode(req, "decode")
    refuse_embeddings_on_decode(req, "prefill")
    refuse_embeddings_on_decode(req, "aggregated")


def test_rooms_are_63_bit_and_name_the_transfer_with_the_request_id() -> None:
    for room in (0, (1 << 63) - 2):
        boot = bootstrap_of(leg(room=room))
        assert boot is not None and boot.transfer_id("rid") == room_transfer_id("rid", room)
        assert prefill_kv(boot, "rid").transfer_id == room_transfer_id("rid", room)
        assert prefill_kv(boot, "rid").minted, "the prefill may still be computing it"
    with pytest.raises(ValueError, match="bootstrap_room must be >= 0"):
        bootstrap_of(leg(room=-1))


@pytest.mark.parametrize(
    ("host", "address"),
    [("127.0.0.1", "127.0.0.1:8998"), ("::1", "[::1]:8998"), ("[::1]", "[::1]:8998")],
)
def test_the_bootstrap_address_is_ipv6_safe(host: str, address: str) -> None:
    boot = bootstrap_of(leg(host=host))
    assert boot is not None and prefill_kv(boot, "rid").address == address


@pytest.mark.parametrize(
    ("host", "port", "words"),
    [
        ("", 8998, "bootstrap_host is empty"),
        ("a/b", 8998, "bootstrap_host"),
        ("localhost:1", 8998, "bootstrap_host"),
        ("localhost", 0, "bootstrap_port must be in 1..65535"),
        ("localhost", -1, "bootstrap_port must be in 1..65535"),
        ("localhost", 70000, "bootstrap_port must be in 1..65535"),
    ],
)
def test_a_bad_bootstrap_address_is_refused(host: str, port: int, words: str) -> None:
    boot = bootstrap_of(leg(host=host, port=port))
    assert boot is not None
    with pytest.raises(ValueError, match=words):
        prefill_kv(boot, "rid")
