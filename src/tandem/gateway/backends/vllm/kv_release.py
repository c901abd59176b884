"""Tell a Tandem prefill worker to drop held KV whose decode leg will never come."""

from __future__ import annotations

import json
import logging

import grpc

from tandem.gateway.backends.vllm.connector import KvKind, KvMode
from tandem.gateway.workers.registry import WorkerRegistry
from tandem.gateway.workers.worker import Worker

log = logging.getLogger("tandem.gateway.pd")


async def release_prefill_kv(
    registry: WorkerRegistry, prefill: Worker, mode: KvMode, kv_json: str | None
) -> None:
    """Best effort: only Tandem workers have a release call; others wait for their lease.

    A prefill worker removed from the registry meanwhile still holds the KV: it is told
    over a channel of its own.
    """
    if mode.kind is not KvKind.TANDEM or not kv_json:
        return
    try:
        transfer_id = json.loads(kv_json).get("transfer_id")
    except (ValueError, AttributeError):
        return
    if not transfer_id:
        return
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
