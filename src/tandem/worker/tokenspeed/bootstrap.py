"""PD over TokenSpeed's KV bootstrap rooms: which leg a request is, and where its KV lives.

Both legs of a PD request carry the same ``request_id`` and the same ``kv_bootstrap_info``
{bootstrap_host, bootstrap_port, bootstrap_room (int64)}; the worker's ``--role`` says
which leg it serves. The prefill worker holds the prompt KV under
``room_transfer_id(request_id, room)``; the decode worker dials
``bootstrap_host:bootstrap_port`` (the prefill's KV side channel: its gRPC port or its
``--disaggregation-bootstrap-port``) and pulls it from there.

``encode_bootstrap_info`` (E/P/D: the images' embeddings come from encode workers) belongs
on an aggregated or prefill leg only; a decode leg gets the prefill's KV, never embeddings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tandem.hostport import check_host, join_host_port
from tandem.wire.tokenspeed import room_transfer_id, tpb
from tandem.worker.config import Role
from tandem.worker.handoff import RemoteKv

Leg = Literal["aggregated", "prefill", "decode"]

NOT_DISAGGREGATED = (
    "kv_bootstrap_info sent to a worker that is not disaggregated (--role both); send "
    "PD legs to --role prefill and --role decode workers, or leave kv_bootstrap_info out"
)
ENCODE_ON_DECODE = (
    "encode_bootstrap_info sent on a decode leg: a decode worker takes the prefill's KV, "
    "never image embeddings; send encode_bootstrap_info on the prefill leg only"
)


@dataclass(frozen=True, slots=True)
class Bootstrap:
    host: str
    port: int
    room: int

    def transfer_id(self, request_id: str) -> str:
        return room_transfer_id(request_id, self.room)


def bootstrap_of(request: tpb.GenerateRequest) -> Bootstrap | None:
    if not request.HasField("kv_bootstrap_info"):
        return None
    info = request.kv_bootstrap_info
    if info.bootstrap_room < 0:
        raise ValueError(
            f"kv_bootstrap_info.bootstrap_room must be >= 0, got {info.bootstrap_room}"
        )
    return Bootstrap(info.bootstrap_host, info.bootstrap_port, info.bootstrap_room)


def leg_of(request: tpb.GenerateRequest, role: Role) -> Leg:
    """The leg a request is on this worker (no checks: the leg counter uses it too)."""
    if not request.HasField("kv_bootstrap_info") or role not in ("prefill", "decode"):
        return "aggregated"
    return "prefill" if role == "prefill" else "decode"


def check_leg(bootstrap: Bootstrap | None, role: Role) -> Leg:
    """The leg, refusing a room on a worker that is not disaggregated."""
    if bootstrap is None:
        return "aggregated"  # a prefill or decode worker serves a plain request whole
    if role not in ("prefill", "decode"):
        raise ValueError(NOT_DISAGGREGATED)
    return "prefill" if role == "prefill" else "decode"


def refuse_embeddings_on_decode(request: tpb.GenerateRequest, leg: Leg) -> None:
    if leg == "decode" and request.HasField("encode_bootstrap_info"):
        raise ValueError(ENCODE_ON_DECODE)


def prefill_kv(bootstrap: Bootstrap, request_id: str) -> RemoteKv:
    """Where a decode leg's KV lives: the prefill's bootstrap address and the room's id."""
    host = bootstrap.host
    if not host:
        raise ValueError(
            "kv_bootstrap_info.bootstrap_host is empty: the decode leg needs "
            "the prefill worker's host"
        )
    host = check_host(host, "kv_bootstrap_info.bootstrap_host")
    if not 0 < bootstrap.port < 65536:
        raise ValueError(
            f"kv_bootstrap_info.bootstrap_port must be in 1..65535, got {bootstrap.port}"
        )
    address = join_host_port(host, bootstrap.port)
    # minted: the prefill leg runs at the same time and may not have stored the KV yet.
    return RemoteKv(address, bootstrap.transfer_id(request_id), minted=True)
