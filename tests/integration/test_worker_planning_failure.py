"""A bug while a worker plans a request is an INTERNAL error that nobody retries.

It used to come back as UNAVAILABLE "could not pull KV" (retryable), so a gateway sent
the request to the next worker, where its media were fetched and processed again. A
real worker runs in-process here (null engine), and one step of its planning is made to
raise: a bug cannot be produced on purpose by any input, so this is the one stand-in.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from tandem.errors import WORKER_ERROR_CODE_KEY, error_from_grpc
from tandem.wire.proto import pb, pb_grpc
from tandem.worker.config import WorkerConfig
from tandem.worker.server import WorkerServer

from .wire_helpers import chat_prompt_ids, request


async def test_a_planning_bug_is_internal_and_not_retryable(
    model_cache: Path, qwen_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = WorkerServer(WorkerConfig(model="tiny-qwen3-vl", engine="null"))
    await server.start()

    async def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug in planning")

    monkeypatch.setattr(server.servicer, "_build", broken)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.VllmEngineStub(channel)
            call = stub.Generate(request("bug-1", chat_prompt_ids(qwen_dir, "hi", 0)), timeout=10)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                async for _ in call:
                    pass
            err = info.value
            assert err.code() == grpc.StatusCode.INTERNAL
            assert "could not pull KV" not in (err.details() or "")
            worker_code = dict(err.trailing_metadata() or ()).get(WORKER_ERROR_CODE_KEY)
            assert worker_code == "internal_error"
            mapped = error_from_grpc("worker_error", err.code(), err.details(), worker_code)
            assert mapped.status == 500 and mapped.retryable is False
            # The worker is still fine.
            reply = await stub.HealthCheck(pb.HealthCheckRequest(), timeout=5)
            assert reply.healthy
    finally:
        await server.stop()
