"""PD over TokenSpeed's KV bootstrap rooms: both legs at once, meeting at a minted room.

Both legs carry the same request id and the same ``kv_bootstrap_info``: the prefill
worker's host (from its address), its bootstrap port and a room drawn per pair from the
63-bit range. Data-parallel placement follows the room (a worker dispatches both legs by
``room % dp_size``), so neither leg is pinned with ``data_parallel_rank``. The prefill leg
is the request as the client asked for it, its pixels spliced in when it is sent; the
decode leg is :func:`decode_clone` of it: every item keeps its metadata (modality,
content hash, model tensors, placeholders, token id: the decode engine places the image
tokens and M-RoPE positions as the prefill did) and loses its ``encoder_input``, and the
E/P/D ``encode_bootstrap_info`` is dropped. The flow is ``pd/parallel.py``.
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
from tandem.wire.tokenspeed import DEFAULT_BOOTSTRAP_PORT, ROOM_LIMIT, room_transfer_id, tpb


def mint_room() -> int:
    """A room in ``[0, 2**63 - 1)``: wide enough that two live requests never share one."""
    return secrets.randbelow(ROOM_LIMIT)


class KvBootstraps:
    """Where each prefill worker meets its decode legs."""

    def __init__(self, ports: dict[str, int | None] | None = None) -> None:
        self._ports = BootstrapPorts(ports, DEFAULT_BOOTSTRAP_PORT)

    def info(self, prefill: Worker) -> tpb.KvBootstrapInfo:
        host, _ = split_host_port(prefill.url)
        return tpb.KvBootstrapInfo(
            bootstrap_host=host,
            bootstrap_port=self._ports.port(prefill),
            bootstrap_room=mint_room(),
        )


def decode_clone(prefill: tpb.GenerateRequest) -> tpb.GenerateRequest:
    """The decode leg of ``prefill``: the same message (request id and bootstrap info
    included) with no item's ``encoder_input`` and no ``encode_bootstrap_info``."""
    decode = tpb.GenerateRequest()
    decode.CopyFrom(prefill)
    for item in decode.mm_inputs.items:
        item.ClearField("encoder_input")
    decode.ClearField("encode_bootstrap_info")
    decode.ClearField("data_parallel_rank")
    return decode


def pd_legs(
    request: tpb.GenerateRequest, info: tpb.KvBootstrapInfo
) -> tuple[tpb.GenerateRequest, tpb.GenerateRequest]:
    """The prefill and decode legs, each its own message, both with ``info``; ``request``
    is kept as it is (a retry after a failed start sends it again)."""
    prefill = tpb.GenerateRequest()
    prefill.CopyFrom(request)
    prefill.kv_bootstrap_info.CopyFrom(info)
    prefill.ClearField("data_parallel_rank")
    return prefill, decode_clone(prefill)


async def open_rooms(
    request: tpb.GenerateRequest,
    pair: Pair,
    registry: WorkerRegistry,
    timeout_s: float,
    bootstraps: KvBootstraps,
    pixels: PixelPayload | None,
) -> OpenedStream:
    info = bootstraps.info(pair.prefill)
    prefill_leg, decode_leg = pd_legs(request, info)
    transfer_id = room_transfer_id(request.request_id, info.bootstrap_room)

    async def release() -> None:
        # Best effort: a Tandem prefill worker drops the room's KV now; others at lease end.
        if pair.prefill.enforces_tandem_media_policy:  # the Tandem marker: it has the call
            await release_held_kv(registry, pair.prefill, transfer_id)

    return await run_parallel(pair, registry, timeout_s, prefill_leg, decode_leg, pixels, release)
