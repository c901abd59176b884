"""A worker that answers a stream with another request's frames (issue 38, item 3): the
stream fails as an INTERNAL worker error in Tandem's words, the call is aborted on the
worker, and none of the other request's tokens reach the caller. A frame whose id carries a
per-sample suffix of ours is still ours.

The server is a protocol-level double on 127.0.0.1 (a generic gRPC handler that answers
whatever id the test gives it): a real worker cannot be made to mix up its streams.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest

from tandem.errors import error_from_grpc
from tandem.gateway.backends.grpc_client import WRONG_REQUEST_ID, answers_another_request
from tandem.gateway.backends.sglang.client import SglangClient
from tandem.gateway.backends.tokenspeed.client import TokenSpeedClient
from tandem.gateway.backends.trtllm.client import TrtllmClient
from tandem.wire.sglang import spb
from tandem.wire.tokenspeed import tpb
from tandem.wire.trtllm import trpb

# protocol: (service, client class, request, one streamed chunk naming ``rid``)
Case = tuple[str, Callable[[str], Any], Callable[[], Any], Callable[[str], bytes]]
CASES: dict[str, Case] = {
    "sglang": (
        "sglang.grpc.scheduler.SglangScheduler",
        SglangClient,
        lambda: spb.GenerateRequest(request_id="mine"),
        lambda rid: spb.GenerateResponse(
            request_id=rid, chunk=spb.GenerateStreamChunk(token_ids=[7])
        ).SerializeToString(),
    ),
    "tokenspeed": (
        "tokenspeed.grpc.scheduler.TokenSpeedScheduler",
        TokenSpeedClient,
        lambda: tpb.GenerateRequest(request_id="mine"),
        lambda rid: tpb.GenerateResponse(
            request_id=rid, chunk=tpb.GenerateStreamChunk(token_ids=[7])
        ).SerializeToString(),
    ),
    "trtllm": (
        "trtllm.TrtllmService",
        TrtllmClient,
        lambda: trpb.GenerateRequest(request_id="mine"),
        lambda rid: trpb.GenerateResponse(
            request_id=rid, chunk=trpb.GenerateStreamChunk(token_ids=[7])
        ).SerializeToString(),
    ),
}


def _identity(data: bytes) -> bytes:
    return data


async def _server(service: str, frame: bytes, aborted: list[str]) -> tuple[grpc.aio.Server, str]:
    async def generate(request: bytes, context: object) -> AsyncIterator[bytes]:
        yield frame

    async def abort(request: bytes, context: object) -> bytes:
        aborted.append("abort")
        return b""

    handler = grpc.method_handlers_generic_handler(
        service,
        {
            "Generate": grpc.unary_stream_rpc_method_handler(
                generate, request_deserializer=_identity, response_serializer=_identity
            ),
            "Abort": grpc.unary_unary_rpc_method_handler(
                abort, request_deserializer=_identity, response_serializer=_identity
            ),
        },
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers([handler])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


@pytest.mark.parametrize("protocol", sorted(CASES))
async def test_a_frame_for_another_request_is_a_coded_worker_error(protocol: str) -> None:
    service, client_class, request, chunk = CASES[protocol]
    aborted: list[str] = []
    server, url = await _server(service, chunk("someone-else"), aborted)
    client = client_class(url)
    try:
        stream = client.generate(request(), timeout=5)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await anext(stream)
        assert info.value.code() == grpc.StatusCode.INTERNAL
        err = error_from_grpc("worker_error", info.value.code(), info.value.details())
        assert (err.code, err.status, err.message) == ("worker_error", 500, WRONG_REQUEST_ID)
    finally:
        await client.close()  # sends the pending Abort first
        await server.stop(0)
    assert aborted == ["abort"]


@pytest.mark.parametrize("protocol", sorted(CASES))
@pytest.mark.parametrize("answered", ["mine", "mine-0", ""])
async def test_our_own_id_or_a_sample_suffix_of_it_is_read(protocol: str, answered: str) -> None:
    service, client_class, request, chunk = CASES[protocol]
    server, url = await _server(service, chunk(answered), [])
    client = client_class(url)
    try:
        frame = await anext(client.generate(request(), timeout=5))
        assert list(frame.token_ids) == [7]
    finally:
        await client.close()
        await server.stop(0)


def test_only_a_different_id_counts_as_another_request() -> None:
    assert answers_another_request(spb.GenerateResponse(request_id="theirs"), "mine")
    assert not answers_another_request(spb.GenerateResponse(request_id="mine_2"), "mine")
    assert not answers_another_request(object(), "mine")  # vLLM and MLX frames carry no id
