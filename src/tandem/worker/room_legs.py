"""A decode leg's KV over a bootstrap room, as the scheduler adapters (SGLang, TokenSpeed)
handle it: pulled from the prefill that holds it, or released when the leg will never pull.

Both adapters' decode legs name the prefill's KV by (request id, room) and pull it from the
prefill's KV side channel with ``handoff.import_described`` (the held media description
included); a leg refused or failed before its pull frees the KV at once, and a leg whose
prefill is still computing frees it once it appears, in the background.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import grpc

from tandem.engine.protocol import Engine
from tandem.engine.request import EngineRequest
from tandem.worker import handoff
from tandem.worker.config import WorkerConfig
from tandem.worker.kv_channel import KvChannelClient
from tandem.worker.refusals import KvImportError


class RoomKvLegs:
    """Mixed into a servicer that has these members."""

    config: WorkerConfig
    engine: Engine
    kv_client: KvChannelClient
    _background: set[asyncio.Task[Any]]

    async def _import(self, engine_request: EngineRequest, remote: handoff.RemoteKv) -> None:
        try:
            described = await handoff.import_described(
                self.kv_client,
                self.engine,
                remote,
                engine_request.prompt_ids,
                self.config.kv_pull_wait_s,
            )
        except Exception as exc:
            raise KvImportError(f"{remote.address}: {_reason(exc)}") from exc
        engine_request.imported_kv = described.kv
        engine_request.local_cached_tokens = described.local_cached_tokens
        engine_request.media = described.media

    async def _release(self, remote: handoff.RemoteKv, *, wait: bool) -> None:
        """Free the prefill's KV; if it is not held yet (its leg still computing) and
        ``wait``, free it once it appears, in the background."""
        if await handoff.release_quietly(self.kv_client, remote) or not wait:
            return
        wait_s = self.config.kv_pull_wait_s
        self._spawn(handoff.release_quietly(self.kv_client, remote, wait_s))

    def _spawn(self, work: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)


def _reason(exc: Exception) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return str(exc) or type(exc).__name__
