"""E/P/D: each image encoded on an encode worker, its embedding pulled by the prefill worker.

Before the PD pair is sent, each item of the request gets an encode worker (by its content
hash, so that a repeated image goes where its embedding is cached: ``--encode-policy
consistent_hashing``, the default; or ``round_robin`` / ``random``) and a room drawn from
the 63-bit range. The item alone, with its pixel rows, goes to that worker as an
``Encode``; the prefill leg gets the items without pixels and ``encode_bootstrap_info``
naming, per item, the encode worker's host, its bootstrap port (``--encode URL PORT``,
else the port it states, else 8998) and the room. The decode leg is the decode clone of
the prefill leg (``pd.py``): no pixels and no encode bootstrap.

Unlike smg, which sends ``Encode`` in the background and leaves a failure to the prefill's
embedding timeout, the gateway waits for every item's acceptance (one round trip, in
parallel) before it sends the pair: a worker that is down or refuses is tried again on
another encode worker, and when none accepts the request fails at once, coded
(``encode_worker_failed``), with no prefill or decode leg sent (docs/worker-protocols.md).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import random
import uuid

import grpc
import numpy as np

from tandem.errors import TandemError, error_from_grpc, make_error
from tandem.gateway.backends.tokenspeed.client import TokenSpeedClient
from tandem.gateway.backends.tokenspeed.mm_items import item_rows
from tandem.gateway.backends.tokenspeed.pd import mint_room
from tandem.gateway.pd.bootstrap_ports import BootstrapPorts
from tandem.gateway.types import ENCODE_POLICIES, EncodePolicy
from tandem.gateway.workers.registry import WorkerRegistry
from tandem.gateway.workers.worker import Worker
from tandem.hostport import split_host_port
from tandem.wire.pixels import PixelPayload
from tandem.wire.tokenspeed import DEFAULT_BOOTSTRAP_PORT, epb, tpb

log = logging.getLogger("tandem.gateway.epd")


class EncodeStage:
    """Sends a request's items to encode workers and writes where the prefill finds them."""

    def __init__(
        self,
        ports: dict[str, int | None] | None = None,
        policy: EncodePolicy = "consistent_hashing",
        attempts: int = 3,
    ) -> None:
        if policy not in ENCODE_POLICIES:
            raise ValueError(f"--encode-policy must be one of {', '.join(ENCODE_POLICIES)}")
        self._ports = BootstrapPorts(ports, DEFAULT_BOOTSTRAP_PORT)
        self._policy = policy
        self._attempts = max(1, attempts)
        self._turn = itertools.count()

    def choose(self, pool: list[Worker], key: bytes) -> Worker:
        """The encode worker for an item whose content hash is ``key``."""
        if self._policy == "round_robin":
            return pool[next(self._turn) % len(pool)]
        if self._policy == "random":
            return random.choice(pool)
        # Rendezvous hashing: a worker added or removed moves only the items it wins or lost.
        return max(pool, key=lambda w: hashlib.blake2b(w.url.encode() + key).digest())

    async def run(
        self,
        request: tpb.GenerateRequest,
        pixels: PixelPayload,
        registry: WorkerRegistry,
        model_id: str,
        timeout_s: float,
    ) -> list[str]:
        """Every item accepted by an encode worker, ``request.encode_bootstrap_info`` set;
        the workers chosen, in item order. ``pixels`` must be normalized."""
        items = list(request.mm_inputs.items)
        slices = _item_pixels(items, pixels)
        placed = await asyncio.gather(
            *(
                self._place(index, item, part, registry, model_id, timeout_s)
                for index, (item, part) in enumerate(zip(items, slices, strict=True))
            )
        )
        info = request.encode_bootstrap_info
        info.Clear()
        for entry, _ in placed:
            info.items.append(entry)
        return [url for _, url in placed]

    async def _place(
        self,
        index: int,
        item: tpb.MultimodalItem,
        pixels: PixelPayload,
        registry: WorkerRegistry,
        model_id: str,
        timeout_s: float,
    ) -> tuple[tpb.EncodeItemBootstrapInfo, str]:
        tried: set[str] = set()
        failure: TandemError | None = None
        for _ in range(self._attempts):
            pool = [w for w in registry.available("encode", model_id) if w.url not in tried]
            if not pool:
                break
            worker = self.choose(pool, item.content_hash)
            tried.add(worker.url)
            room = mint_room()
            try:
                await self._encode(registry, worker, item, pixels, room, timeout_s)
            except TandemError as err:
                failure = err
                if not err.retryable:
                    raise
                log.warning("encode worker %s failed item %d: %s", worker.url, index, err.message)
                continue
            host, _ = split_host_port(worker.url)
            entry = tpb.EncodeItemBootstrapInfo(
                item_index=index,
                bootstrap_host=host,
                bootstrap_port=self._ports.port(worker),
                bootstrap_room=room,
            )
            return entry, worker.url
        if failure is not None:
            raise failure
        raise make_error(
            "no_available_encode_workers", f"no healthy encode worker for model {model_id!r}"
        )

    async def _encode(
        self,
        registry: WorkerRegistry,
        worker: Worker,
        item: tpb.MultimodalItem,
        pixels: PixelPayload,
        room: int,
        timeout_s: float,
    ) -> None:
        client = registry.client(worker.url)
        if not isinstance(client, TokenSpeedClient):  # a registry of another protocol
            raise make_error("internal_error", f"encode worker {worker.url} is not TokenSpeed's")
        request = epb.EncodeRequest(request_id=f"encode-{uuid.uuid4().hex}")
        request.mm_inputs.items.add().CopyFrom(item)
        request.items.add(bootstrap_room=room)
        try:
            answer = await client.encode(request, pixels, timeout_s)
        except grpc.aio.AioRpcError as err:
            worker.breaker.record_failure()
            raise error_from_grpc("encode_worker_failed", err.code(), err.details()) from None
        if not answer.accepted:
            worker.breaker.record_failure()
            raise make_error(
                "encode_worker_failed", f"encode worker {worker.url} did not accept the item"
            )


def _item_pixels(items: list[tpb.MultimodalItem], pixels: PixelPayload) -> list[PixelPayload]:
    """Each item's rows of the batch, as views (no copy)."""
    array = np.asarray(pixels.array).reshape(pixels.shape)
    parts, start = [], 0
    for item in items:
        rows = item_rows(item)
        part = array[start : start + rows]
        parts.append(PixelPayload(part, tuple(int(d) for d in part.shape), pixels.dtype))
        start += rows
    if start != pixels.shape[0]:
        raise make_error(
            "internal_error", f"the items own {start} of the {pixels.shape[0]} pixel rows"
        )
    return parts
