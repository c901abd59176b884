"""Peer channels (tandem/wire/peer_channels.py): a peer that went away and came back on its
address answers the next call, even when the channel last saw its connection fail; a peer
that stays away fails within the grace. Real gRPC servers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from tandem.wire.peer_channels import RECONNECT_GRACE_S, PeerChannels, once_more_when_unavailable

SERVICE = "tandem.test.Echo"


def _identity(data: bytes) -> bytes:
    return data


async def _echo_server(port: int = 0) -> tuple[grpc.aio.Server, int]:
    async def echo(request: bytes, context: object) -> bytes:
        return request

    handler = grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Echo": grpc.unary_unary_rpc_method_handler(
                echo, request_deserializer=_identity, response_serializer=_identity
            )
        },
    )
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers([handler])
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server, bound


def _echo(channel: grpc.aio.Channel, data: bytes) -> grpc.aio.UnaryUnaryCall:
    call = channel.unary_unary(
        f"/{SERVICE}/Echo", request_serializer=_identity, response_deserializer=_identity
    )
    return call(data, timeout=5)


async def test_a_peer_back_on_its_address_answers_the_next_call() -> None:
    server, port = await _echo_server()
    peers = PeerChannels()
    channel = peers.get(f"127.0.0.1:{port}")
    try:
        assert await _echo(channel, b"one") == b"one"
        await server.stop(0)
        with pytest.raises(grpc.aio.AioRpcError) as info:  # the peer is down: a plain failure
            await _echo(channel, b"lost")
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        server, _ = await _echo_server(port)
        started = time.monotonic()
        reply = await once_more_when_unavailable(channel, lambda: _echo(channel, b"two"))
        assert reply == b"two"
        assert time.monotonic() - started < RECONNECT_GRACE_S + 0.5
    finally:
        await peers.close()
        await server.stop(0)


async def test_a_peer_that_stays_away_fails_within_the_grace() -> None:
    server, port = await _echo_server()
    await server.stop(0)
    peers = PeerChannels()
    channel = peers.get(f"127.0.0.1:{port}")
    try:
        started = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await once_more_when_unavailable(channel, lambda: _echo(channel, b"x"))
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert time.monotonic() - started < RECONNECT_GRACE_S + 2.0
    finally:
        await peers.close()


async def test_one_channel_per_address_and_other_failures_are_not_repeated() -> None:
    peers = PeerChannels()
    try:
        assert peers.get("127.0.0.1:1") is peers.get("127.0.0.1:1")
        calls = 0

        async def refused() -> bytes:
            nonlocal calls
            calls += 1
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.NOT_FOUND, grpc.aio.Metadata(), grpc.aio.Metadata(), "gone"
            )

        with pytest.raises(grpc.aio.AioRpcError):
            await once_more_when_unavailable(peers.get("127.0.0.1:1"), refused)
        assert calls == 1
    finally:
        await peers.close()
        await asyncio.sleep(0)
