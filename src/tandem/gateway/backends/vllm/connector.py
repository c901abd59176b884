"""KV connector modes and the KV handoff between the legs (docs/pd-contract.md §8).

The mode is read from the prefill worker's labels. The gateway never sees KV
bytes: it tags the prefill leg, then relays (or, for a minted transfer id,
writes) the ``kv_transfer_params`` the decode leg pulls with.
"""

from __future__ import annotations

import enum
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from tandem.ascii_int import ascii_int
from tandem.gateway.workers.worker import Worker
from tandem.hostport import join_host_port
from tandem.wire.kv_params import PREFILL_TAG, dumps_compact
from tandem.wire.proto import pb

log = logging.getLogger("tandem.gateway.pd")

DEFAULT_BOOTSTRAP_PORT = 8998
_mint_uuid: Callable[[], uuid.UUID] = getattr(uuid, "uuid7", uuid.uuid4)  # uuid7: Python 3.14+
_passthrough_warned = False  # the passthrough WARN is logged once per process


class KvKind(enum.Enum):
    MOONCAKE = "mooncake"
    NIXL = "nixl"
    PASSTHROUGH = "passthrough"
    # Tandem's own worker: it relays like NIXL, and also takes a gateway-minted
    # transfer id (decode may pull before prefill is done), so it allows parallel dispatch.
    TANDEM = "tandem"


@dataclass(frozen=True, slots=True)
class KvMode:
    kind: KvKind
    host: str = ""  # the prefill worker's host (Mooncake bootstrap, Tandem KV channel)
    port: int = 0  # Mooncake: the bootstrap port; Tandem: the worker's gRPC port
    engine_id: str | None = None  # Mooncake only; None means legacy host/port handoff

    @property
    def accepts_minted_id(self) -> bool:
        """Whether the prefill worker keeps its KV under a transfer id the gateway chose."""
        if self.kind is KvKind.MOONCAKE:
            return self.engine_id is not None
        return self.kind is KvKind.TANDEM


def kv_mode_for_worker(prefill: Worker, dp_rank: int | None = None) -> KvMode:
    """The KV mode of ``prefill``; ``dp_rank`` is its data-parallel rank when pinned."""
    global _passthrough_warned
    connector = prefill.kv_connector
    host, port = _host_port(prefill.url)
    if connector == "MooncakeConnector":
        return KvMode(
            KvKind.MOONCAKE, host, _bootstrap_port(prefill), _mooncake_engine_id(prefill, dp_rank)
        )
    if connector == "NixlConnector":
        return KvMode(KvKind.NIXL, host, port)
    if connector == "TandemConnector":
        return KvMode(KvKind.TANDEM, host, port)
    if not _passthrough_warned:
        _passthrough_warned = True
        log.warning(
            "vLLM PD: no kv_connector detected on prefill worker; KV transfer params will "
            "only be relayed if the engine returns them"
        )
    return KvMode(KvKind.PASSTHROUGH, host, port)


def _host_port(url: str) -> tuple[str, int]:
    """Host and port (0 if none) of "host:port", "[::1]:port" or "grpc://host:port"."""
    parts = urlsplit(url if "//" in url else f"//{url}")
    try:
        return parts.hostname or "", parts.port or 0
    except ValueError:  # a port that is not a number or out of range
        return parts.hostname or "", 0


def _bootstrap_port(worker: Worker) -> int:
    raw = worker.labels.get("bootstrap_port")
    if raw is None:
        return DEFAULT_BOOTSTRAP_PORT
    port = ascii_int(raw)
    if port is not None and 0 < port < 65536:
        return port
    log.warning("worker %s: bootstrap_port label %r is not a port; using 8998", worker.url, raw)
    return DEFAULT_BOOTSTRAP_PORT


def _mooncake_engine_id(worker: Worker, dp_rank: int | None) -> str | None:
    """The engine id decode pulls from; None falls back to the legacy host/port handoff."""
    engine_id = worker.labels.get("kv_engine_id", "")
    if not engine_id:
        return None
    raw_dp = worker.labels.get("data_parallel_size")
    dp_size = ascii_int(raw_dp) or 0
    if raw_dp is not None and dp_size < 1:
        log.warning(
            "worker %s: data_parallel_size label %r is not a positive integer; "
            "Mooncake falls back to the legacy host/port handoff",
            worker.url,
            raw_dp,
        )
        return None
    if dp_size <= 1:
        return engine_id
    # Each DP rank is its own Mooncake engine; without a pinned rank the owner is unknown.
    return f"{engine_id}_dp{dp_rank}" if dp_rank is not None else None


def mint_transfer_id() -> str:
    return f"xfer-{_mint_uuid()}"


def mints_transfer_id(mode: KvMode, relay: bool) -> bool:
    """Whether the gateway mints the transfer id (single-consumer KV only, so relay is needed)."""
    return relay and mode.accepts_minted_id


def _tag(mode: KvMode, relay: bool, transfer_id: str | None) -> dict[str, Any] | None:
    if not relay:
        return None  # n > 1: the KV would have n consumers, so none is exported
    if transfer_id is not None:
        if not mode.accepts_minted_id:
            raise ValueError(f"a {mode.kind.value} prefill worker cannot take a minted transfer id")
        return {**PREFILL_TAG, "transfer_id": transfer_id}
    if mode.kind in (KvKind.NIXL, KvKind.TANDEM):
        return dict(PREFILL_TAG)
    return None  # passthrough, or Mooncake without an engine id (legacy host/port)


def prefill_tag(mode: KvMode, relay: bool, transfer_id: str | None) -> str | None:
    """The ``kv_transfer_params_json`` of the prefill leg, or None for an untagged leg."""
    if not relay and mode.kind is KvKind.NIXL:
        log.debug("vLLM PD (NIXL): n > 1, prefill leg sent without kv_transfer_params")
    tag = _tag(mode, relay, transfer_id)
    return dumps_compact(tag) if tag is not None else None


def identity_solicited(mode: KvMode, relay: bool, transfer_id: str | None) -> bool:
    """A prefill worker builds a media identity only when its leg carried KV params."""
    return _tag(mode, relay, transfer_id) is not None


def decode_params_for_minted(mode: KvMode, transfer_id: str) -> str:
    """The decode leg's ``kv_transfer_params_json`` for a gateway-minted transfer id."""
    pull = {"do_remote_decode": False, "do_remote_prefill": True, "transfer_id": transfer_id}
    if mode.kind is KvKind.MOONCAKE and mode.engine_id is not None:
        pull["remote_engine_id"] = mode.engine_id
        pull["remote_bootstrap_addr"] = f"http://{join_host_port(mode.host, mode.port)}"
        return dumps_compact(pull)
    if mode.kind is KvKind.TANDEM:
        if not mode.host or not 0 < mode.port < 65536:
            raise ValueError("a Tandem prefill worker needs a host:port URL to be pulled from")
        return dumps_compact({**pull, "remote_host": mode.host, "remote_port": mode.port})
    raise ValueError(f"a {mode.kind.value} prefill worker cannot take a minted transfer id")


def handoff(
    mode: KvMode,
    relay: bool,
    prefill_json: str | None,
    minted_id: str | None,
    decode_leg: pb.GenerateRequest,
    *,
    on_transfer_failure: Callable[[], None] | None = None,
    request_id: str = "",
) -> bool:
    """Give the decode leg its KV params (docs/pd-contract.md §8); True when it got any.

    ``prefill_json`` is what the prefill worker returned ("" reads as nothing).
    ``on_transfer_failure`` is called when a relaying prefill worker returned no
    params although asked (the caller counts ``tandem_pd_kv_transfer_failures_total``).
    """
    if minted_id is not None and mode.accepts_minted_id:
        _set_json(decode_leg, decode_params_for_minted(mode, minted_id))
        return True
    if mode.kind is KvKind.MOONCAKE:
        # Legacy Mooncake (no engine id, or n > 1): decode bootstraps from host/port.
        decode_leg.ClearField("kv_transfer_params_json")
        decode_leg.kv_transfer_params.remote_host = mode.host
        decode_leg.kv_transfer_params.remote_port = mode.port
        return True
    if not relay:
        return False  # n > 1: decode recomputes the prompt from the full payload
    if prefill_json:
        _set_json(decode_leg, prefill_json)  # verbatim: the object belongs to the engines
        return True
    if mode.kind in (KvKind.NIXL, KvKind.TANDEM):
        label = "vLLM PD (NIXL)" if mode.kind is KvKind.NIXL else "PD (TandemConnector)"
        log.warning(
            "request %s: %s: prefill returned no kv_transfer_params; decode will recompute the "
            "prompt locally (outdated smg-grpc-servicer or missing kv-transfer-config?)",
            request_id or decode_leg.request_id,
            label,
        )
        if on_transfer_failure is not None:
            on_transfer_failure()
    return False


def _set_json(leg: pb.GenerateRequest, params_json: str) -> None:
    # One wire form only: a stale legacy field next to the JSON would name another source.
    leg.ClearField("kv_transfer_params")
    leg.kv_transfer_params_json = params_json
