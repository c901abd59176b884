"""Tell a Tandem prefill worker to drop held KV whose decode leg will never come."""

from __future__ import annotations

import json
import logging

import grpc

from tandem.gateway.pd.connector import KvKind, KvMode
from tandem.gateway.workers.worker import Worker

log = logging.getLogger("tandem.gateway.pd")
RELEASE_METHOD = "/tandem.kv.KvTransfer/Release"


async def release_prefill_kv(prefill: Worker, mode: KvMode, kv_json: str | None) -> None:
    """Best effort: only Tandem workers have a release call; others wait for their lease."""
    if mode.kind is not KvKind.TANDEM or not kv_json:
        return
    try:
        transfer_id = json.loads(kv_json).get("transfer_id")
    except (ValueError, AttributeError):
        return
    if not transfer_id:
        return
    try:
        async with grpc.aio.insecure_channel(prefill.url) as channel:
            call = channel.unary_unary(
                RELEASE_METHOD,
                request_serializer=lambda v: json.dumps(v).encode(),
                response_deserializer=json.loads,
            )
            await call({"transfer_id": transfer_id}, timeout=2.0)
    except grpc.aio.AioRpcError as err:
        log.info("could not release KV %s on %s: %s", transfer_id, prefill.url, err.details())
