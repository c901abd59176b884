"""Advertise this worker as a Tandem worker on ``GetServerInfo`` (``tandem.wire.worker_marker``).

A server interceptor, so the servicer stays a plain implementation of its protocol: it wraps
only the active protocol's ``GetServerInfo`` handler (vLLM's unless told another,
``worker/adapters.py`` names each) and adds the marker to that call's trailing metadata.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from tandem import __version__
from tandem.wire.worker_marker import GET_SERVER_INFO_METHOD, TANDEM_WORKER_METADATA_KEY

log = logging.getLogger("tandem.worker")


class TandemMarker(grpc.aio.ServerInterceptor):
    """Adds ``tandem-worker: <version>`` to every answer of ``method`` (a full gRPC method
    name, ``/package.Service/GetServerInfo``)."""

    def __init__(self, method: str = GET_SERVER_INFO_METHOD) -> None:
        self.method = method

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if (
            handler is None
            or handler_call_details.method != self.method
            or handler.unary_unary is None
        ):
            return handler
        inner = handler.unary_unary

        async def get_server_info(request: Any, context: grpc.aio.ServicerContext) -> Any:
            response = await inner(request, context)
            context.set_trailing_metadata(((TANDEM_WORKER_METADATA_KEY, __version__),))
            return response

        return grpc.unary_unary_rpc_method_handler(
            get_server_info,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


def server_interceptors(
    advertise_as_vllm: bool, method: str = GET_SERVER_INFO_METHOD
) -> list[grpc.aio.ServerInterceptor]:
    """The worker's interceptors (the marker on ``method``); none with
    ``--test-only-advertise-as-vllm``."""
    if advertise_as_vllm:
        log.warning(
            "--test-only-advertise-as-vllm: this worker does not advertise itself as a Tandem "
            "worker; gateways will send it gateway-fetched data: URLs instead of media URLs"
        )
        return []
    return [TandemMarker(method)]
