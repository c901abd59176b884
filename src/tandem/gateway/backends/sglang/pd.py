"""PD over SGLang's bootstrap rooms: both legs at once, meeting at a room the gateway mints.

Both legs carry the same request id and the same ``disaggregated_params``: the prefill
worker's host (from its address), its bootstrap port and a room drawn per pair. The
prefill leg is the request as the client asked for it, with the pixels; the decode leg is
the same message without ``mm_inputs`` (the pixel-free clone: the decode worker learns the
media it needs from the prefill worker at the rendezvous). The flow is ``pd/parallel.py``.
Port: ``--prefill URL PORT``, else the port the worker states (``server_args``), else
SGLang's default, 8998 (docs/worker-protocols.md).
"""

from __future__ import annotations

import secrets

from tandem.gateway.dispatch.streams import OpenedStream
from tandem.gateway.pd.bootstrap_ports import BootstrapPorts
from tandem.gateway.pd.kv_release import release_held_kv
from tandem.gateway.pd.parallel import run_parallel
from tandem.gateway.pd.selection import Pair
from tandem.gateway.workers.registry import WorkerRegistry
from tandem.gateway.workers.worker import Worker
from tandem.hostport import split_host_port
from tandem.wire.pixels import PixelPayload
from tandem.wire.sglang import DEFAULT_BOOTSTRAP_PORT, ROOM_LIMIT, room_transfer_id, spb


def mint_room() -> int:
    """A room in ``[0, 2**31 - 1)``, as SGLang's engines and smg use them."""
    return secrets.randbelow(ROOM_LIMIT)


class Bootstraps:
    """Where each prefill worker meets its decode legs."""

    def __init__(self, ports: dict[str, int | None] | None = None) -> None:
        self._ports = BootstrapPorts(ports, DEFAULT_BOOTSTRAP_PORT)

    def params(self, prefill: Worker) -> spb.DisaggregatedParams:
        host, _ = split_host_port(prefill.url)
        return spb.DisaggregatedParams(
            bootstrap_host=host, bootstrap_port=self.port(prefill), bootstrap_room=mint_room()
        )

    def port(self, prefill: Worker) -> int:
        return self._ports.port(prefill)


def pd_legs(
    request: spb.GenerateRequest, params: spb.DisaggregatedParams
) -> tuple[spb.GenerateRequest, spb.GenerateRequest]:
    """The prefill leg (the request, media included) and the decode leg (without
    ``mm_inputs``), each its own message, both with ``params``; ``request`` is kept as it
    is (a retry after a failed start sends it again)."""
    prefill = spb.GenerateRequest()
    prefill.CopyFrom(request)
    prefill.disaggregated_params.CopyFrom(params)
    decode = spb.GenerateRequest()
    decode.CopyFrom(prefill)
    decode.ClearField("mm_inputs")
    return prefill, decode


async def open_rooms(
    request: spb.GenerateRequest,
    pair: Pair,
    registry: WorkerRegistry,
    timeout_s: float,
    bootstraps: Bootstraps,
    pixels: PixelPayload | None,
) -> OpenedStream:
    params = bootstraps.params(pair.prefill)
    prefill_leg, decode_leg = pd_legs(request, params)
    transfer_id = room_transfer_id(request.request_id, params.bootstrap_room)

    async def release() -> None:
        await release_room(registry, pair.prefill, transfer_id)

    return await run_parallel(pair, registry, timeout_s, prefill_leg, decode_leg, pixels, release)


async def release_room(registry: WorkerRegistry, prefill: Worker, transfer_id: str) -> None:
    """Best effort: a Tandem prefill worker drops the room's KV now; others at lease end."""
    if prefill.enforces_tandem_media_policy:  # the Tandem marker: it has the call
        await release_held_kv(registry, prefill, transfer_id)
