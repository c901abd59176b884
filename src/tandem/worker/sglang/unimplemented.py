"""The ``SglangScheduler`` RPCs this worker does not serve: UNIMPLEMENTED, with a reason.

The generated base class answers UNIMPLEMENTED too, but by raising NotImplementedError,
which grpc logs at ERROR with a traceback each time. (``SubscribeKvEvents`` and
``FlushCache`` are served: ``worker/kv_events/stream.py``.)
"""

from __future__ import annotations

from typing import Any

import grpc


async def _refuse(context: grpc.aio.ServicerContext, what: str) -> None:
    await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"Tandem workers {what}")


class Unimplemented:
    async def Embed(self, request: Any, context: grpc.aio.ServicerContext) -> None:
        await _refuse(context, "serve generation models only (no Embed)")

    async def StartProfile(self, request: Any, context: grpc.aio.ServicerContext) -> None:
        await _refuse(context, "have no profiler")

    async def StopProfile(self, request: Any, context: grpc.aio.ServicerContext) -> None:
        await _refuse(context, "have no profiler")

    async def LoadLoRAAdapter(self, request: Any, context: grpc.aio.ServicerContext) -> None:
        await _refuse(context, "serve no LoRA adapters")

    async def UnloadLoRAAdapter(self, request: Any, context: grpc.aio.ServicerContext) -> None:
        await _refuse(context, "serve no LoRA adapters")

    async def ListLoadedLoRAAdapters(self, request: Any, context: grpc.aio.ServicerContext) -> None:
        await _refuse(context, "serve no LoRA adapters")
