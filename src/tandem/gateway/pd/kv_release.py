"""Tell a Tandem prefill worker to drop held KV whose decode leg will never come."""

from __future__ import annotations

import logging

import grpc

from tandem.gateway.workers.registry import WorkerRegistry
from tandem.gateway.workers.worker import Worker

log = logging.getLogger("tandem.gateway.pd")


async def release_held_kv(registry: WorkerRegistry, prefill: Worker, transfer_id: str) -> None:
    """Best effort, for workers with Tandem's KV side channel (the caller checks).

    A prefill worker removed from the registry meanwhile still holds the KV: it is told
    over a channel of its own.
    """
    try:
        client, own = registry.client(prefill.url), False
    except KeyError:
        client, own = registry.detached_client(prefill.url), True
    try:
        await client.release_kv(transfer_id)
    except grpc.aio.AioRpcError as err:
        log.info("could not release KV %s on %s: %s", transfer_id, prefill.url, err.details())
    finally:
        if own:
            await client.close()
