"""Tell a Tandem prefill worker to drop held KV whose decode leg will never come."""

from __future__ import annotations

import json

from tandem.gateway.backends.vllm.connector import KvKind, KvMode
from tandem.gateway.pd.kv_release import release_held_kv
from tandem.gateway.workers.registry import WorkerRegistry
from tandem.gateway.workers.worker import Worker


async def release_prefill_kv(
    registry: WorkerRegistry, prefill: Worker, mode: KvMode, kv_json: str | None
) -> None:
    """Best effort: only Tandem workers have a release call; others wait for their lease."""
    if mode.kind is not KvKind.TANDEM or not kv_json:
        return
    try:
        transfer_id = json.loads(kv_json).get("transfer_id")
    except (ValueError, AttributeError):
        return
    if not transfer_id:
        return
    await release_held_kv(registry, prefill, transfer_id)
