"""A worker whose Generate frames do not parse (issue 38, item 3): the stream fails as an
INTERNAL worker error in Tandem's words, and the call is ended and aborted on the worker.

The server is a protocol-level double on 127.0.0.1 (a generic gRPC handler answering raw
bytes): a real worker cannot be made to send corrupted frames.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from tandem.errors import error_from_grpc
from tandem.gateway.backends.grpc_client import GARBLED_FRAME
from tandem.gateway.backends.sglang.client import SglangClient
from tandem.gateway.backends.vllm.client import VllmClient
from tandem.wire.proto import pb
from tandem.wire.sglang import spb

SERVICES = ("vllm.grpc.engine.VllmEngine", "sglang.grpc.scheduler.SglangScheduler")


@pytest.fixture
async def garbage_url() -> AsyncIterator[tuple[str, list[str]]]:
    aborted: list[str] = []

    async def generate(request: bytes, context: object) -> AsyncIterator[bytes]:
        yield b"\xff\xff\xff not a protobuf message"

    async def abort(request: bytes, context: object) -> bytes:
        aborted.append("abort")
        return b""

    def identity(data: bytes) -> bytes:
        return data

    handlers = [
        grpc.method_handlers_generic_handler(
            service,
            {
                "Generate": grpc.unary_stream_rpc_method_handler(
                    generate, request_deserializer=identity, response_serializer=identity
                ),
                "Abort": grpc.unary_unary_rpc_method_handler(
                    abort, request_deserializer=identity, response_serializer=identity
                ),
            },
        )
        for service in SERVICES
    ]
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(handlers)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}", aborted
    finally:
        await server.stop(0)


@pytest.mark.parametrize("protocol", ["vllm", "sglang"])
async def test_a_frame_that_does_not_parse_is_a_coded_worker_error(
    garbage_url: tuple[str, list[str]], protocol: str
) -> None:
    url, aborted = garbage_url
    if protocol == "vllm":
        client: VllmClient | SglangClient = VllmClient(url)
        stream = client.generate(pb.GenerateRequest(request_id="r"), timeout=5)
    else:
        client = SglangClient(url)
        stream = client.generate(spb.GenerateRequest(request_id="r"), timeout=5)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await anext(stream)
        assert info.value.code() == grpc.StatusCode.INTERNAL
        assert info.value.details() == GARBLED_FRAME
        err = error_from_grpc("worker_error", info.value.code(), info.value.details())
        assert (err.code, err.status, err.message) == ("worker_error", 500, GARBLED_FRAME)
    finally:
        await client.close()  # sends the pending Abort first
    assert aborted == ["abort"]
