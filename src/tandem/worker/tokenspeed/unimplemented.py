"""The ``TokenSpeedScheduler`` RPCs this worker does not serve: UNIMPLEMENTED, with a reason.

The generated base class answers UNIMPLEMENTED too, but by raising NotImplementedError,
which grpc logs at ERROR with a traceback each time; smg, for one, subscribes to every
worker's KV events at registration.
"""

from __future__ import annotations

from typing import Any

import grpc


async def _refuse(context: grpc.aio.ServicerContext, what: str) -> None:
    await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"Tandem workers {what}")


class Unimplemented:
    async def SubscribeKvEvents(self, request: Any, context: grpc.aio.ServicerContext) -> None:
        await _refuse(context, "publish no KV cache events")

    async def FlushCache(self, request: Any, context: grpc.aio.ServicerContext) -> None:
        await _refuse(context, "do not flush their prefix cache on request")

    async def StartProfile(self, request: Any, context: grpc.aio.ServicerContext) -> None:
        await _refuse(context, "have no profiler")

    async def StopProfile(self, request: Any, context: grpc.aio.ServicerContext) -> None:
        await _refuse(context, "have no profiler")
